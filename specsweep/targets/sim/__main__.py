from specsweep.targets.sim.server import main

main()
