from tests.real.fixtures import real_tools  # noqa: F401  (the real-program fixtures)
