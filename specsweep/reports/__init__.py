"""For people: what a comparison or a grid found, as tables (terminal and markdown), plots, and the
report folder written beside the data. Everything here reads the analysis's data; nothing here
decides anything."""
