"""An SGLang-compatible simulated server: SGLang's HTTP surface, a calibrated performance
model of a large GPU deployment, and faults on demand. ``specsweep sim`` runs it."""
