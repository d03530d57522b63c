"""engine-example-reasoning: an example third-party Engine plugin (a reasoning parser)."""
