"""Test helpers that ship with the engine: the one fake ``EngineClient`` (``fake_client``)
for tests of the HTTP layer that need control over what the engine "generates"."""
