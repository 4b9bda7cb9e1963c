"""Reading and editing libcst trees: nodes, cheap metadata (parents, order, qualified names,
positions), call arguments, statement edits, notebooks and source encodings."""
