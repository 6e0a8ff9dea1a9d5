"""One module per verb: a typed function that returns data, and a renderer for people."""
