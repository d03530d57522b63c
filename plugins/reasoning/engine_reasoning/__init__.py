"""engine-reasoning: parsers that separate a model's think section from its answer.

The entry point is ``engine_reasoning.plugin`` (metadata only); each parser lives in its own
module and is imported only when the server selects it.
"""
