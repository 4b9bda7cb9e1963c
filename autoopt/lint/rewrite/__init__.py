"""`autoopt rewrite`: applying fixes to a fixed point, each edit verified before it is written
(names bound on every path, the result parses, no new finding), and the larger codemods."""
