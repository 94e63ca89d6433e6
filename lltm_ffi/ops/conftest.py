"""The fixtures and hooks of lltm_ffi.testing, for the tests in each op folder."""

from lltm_ffi.testing import (cuda_device, device, dtype, generator,  # noqa: F401
                              pytest_collection_modifyitems, pytest_configure,
                              pytest_runtest_makereport, seed,
                              seeded_global_generators)
