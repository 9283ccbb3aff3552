"""`tformer report`: the whole system analysis of a model on this machine, and its pieces."""
