"""engine-outlines: the default structured-output backend, built on outlines-core.

The entry point is ``engine_outlines.plugin`` (metadata only). ``backend`` turns a
constraint into a regex (``regexes``), the regex into an outlines-core ``Index`` over the
tokenizer's byte vocabulary (``vocabulary``), and serves per-request matchers
(``grammar``). Nothing is written to disk: outlines-core keeps no cache of its own.
"""
