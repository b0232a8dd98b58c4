"""IR utilities every level shares, below the dialects and the parser: element types,
identifier rules, value names, the kernel kinds fusion records."""
