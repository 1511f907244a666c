"""The recipe that runs the engine tests on other architectures under emulation (run.sh) and its
pytest plugin (emulated.py)."""
