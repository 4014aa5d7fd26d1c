"""One module per op: check inputs -> pick config -> launch."""
