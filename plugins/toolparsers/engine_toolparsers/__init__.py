"""engine-toolparsers: tool-call parsers for the OpenAI-compatible server.

The entry point is ``engine_toolparsers.plugin`` (metadata only); each parser lives in its
own module and is imported only when a request selects it.
"""
