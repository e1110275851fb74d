"""The simulator's worlds (``bench/_world.py``): each module's ``worlds()`` returns one world
per workload."""
