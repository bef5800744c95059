"""One module per paper: its grids, published numbers, reports and figures."""
