from specsweep.engines.sglang.sim.server import main

main()
