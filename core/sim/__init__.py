"""The simulation kit: simulated cards shared across processes, a stub engine, and a stand-in
``cuda-checkpoint`` with the real command line."""
