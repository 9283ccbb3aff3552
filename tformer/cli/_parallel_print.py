"""Human output of a layout over several devices, for `tformer count` and `tformer scale` (not a command)."""

from __future__ import annotations

from tformer.cli._cost_common import console
from tformer.core import fmt

_MEMORY_ROWS = ("weights", "kept_shard", "gathered_layer", "gradients", "optimizer", "activations", "logits",
                "kv_cache", "total")


def print_parallel(par: dict, workload) -> None:
    from rich.table import Table  # deferred: --json output never loads rich

    con = console()
    lay, mem = par["layout"], par["per_device"]
    con.print(f"[bold]Beyond one device[/bold]: {lay['text']}; global batch {lay['global_batch']:,} "
              f"({workload.batch:,} per replica)")
    t = Table(title=f"memory per device (the fullest: pipeline stage {mem['stage']}, {fmt.params(mem['params'])} "
                    "parameters held before ZeRO sharding)")
    t.add_column("part")
    t.add_column("bytes", justify="right")
    for key in _MEMORY_ROWS:
        if mem[key] or key in ("weights", "total"):
            t.add_row(key.replace("_", " "), fmt.nbytes(mem[key]))
    con.print(t)
    comm = par["communication"]
    if comm["bytes"]:
        link = fmt.bandwidth(comm["link_bandwidth"]) if comm["link_bandwidth"] else "unknown"
        c = Table(title=f"sent per device per step (link {link} one way; {comm.get('link_source', '')})")
        for col in ("traffic", "bytes", "calls", "seconds"):
            c.add_column(col, justify="left" if col == "traffic" else "right")
        bw, lat = comm["link_bandwidth"], comm.get("link_latency") or 0.0
        for kind, n in comm["bytes"].items():
            calls = comm["calls"][kind]
            c.add_row(kind.replace("_", " "), fmt.nbytes(n), str(calls), fmt.seconds(n / bw + calls * lat) if bw else "-")
        con.print(c)
    pipe = par["pipeline"]
    if pipe["stages"] > 1:
        con.print(f"pipeline bubble (P - 1) / (M + P - 1) = {fmt.pct(pipe['bubble_fraction'])} "
                  f"({pipe['stages']} stages, {pipe['micro_batches']} micro-batches)")
    tm = par["time"]
    if tm["compute_s"] is not None:
        comm_s = fmt.seconds(tm["communication_s"]) if tm["communication_s"] is not None else "unknown"
        line = f"step per device: compute {fmt.seconds(tm['compute_s'])}, communication {comm_s}"
        if not comm["bytes"]:
            line = f"step per device: compute {fmt.seconds(tm['compute_s'])}, no traffic between devices"
        elif tm["communication_s"] is not None:
            line += (f"; overlapped {fmt.seconds(tm['overlapped_s'])}, not overlapped {fmt.seconds(tm['serial_s'])}")
        con.print(line)
    need = par.get("devices_needed")
    if need is not None:
        if need["devices"] is None:
            con.print(f"devices needed: none fits — {need['reason']}")
        else:
            con.print(f"devices needed: {need['devices']:,} of {fmt.nbytes(need['memory_bytes'])} "
                      f"({need['layout']}; {fmt.nbytes(need['per_device_total'])} on the fullest device)")
