"""From a table's SQL to the plan its steps run: parse and check (`compile`), build the operator
graph (`plan`), rewrite it (`optimize`, a list of small passes), and the fingerprint and keys of
what a definition produces."""
