"""The command-line tools: `irc-opt`, `irc-run`, their shared argument handling, and
the Graphviz view of fusion."""
