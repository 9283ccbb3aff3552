"""The ledger: what a Transformer costs, op by op (parameters, FLOPs, bytes, time on a device)."""
