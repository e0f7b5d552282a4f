"""Development-time generators (spec → table, spec → diagrams). Never imported at run time."""
