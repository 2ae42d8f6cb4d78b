from tests.real.fixtures import real_swap, real_tools  # noqa: F401  (fixtures)
