from tests.runtime.chain_fixtures import chain_device, isolated  # noqa: F401
