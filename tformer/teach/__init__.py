"""Teaching tools: attention worked through by hand (`tformer attention --walkthrough`)."""
