"""engine-myplugin: an Engine plugin made from the plugin template."""
