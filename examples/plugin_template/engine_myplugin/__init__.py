"""engine-myplugin: an Engine plugin (tool_parser)."""
