"""The engine core: scheduler, paged KV cache bookkeeping and the step loop.

``Scheduler`` (scheduler.py) decides each step's tokens, ``KVCacheManager`` (kv_cache/)
owns block tables and the prefix cache, ``EngineCore`` (engine_core.py) runs
schedule -> runner.execute -> update_from_output. Import from the submodules; this package
imports nothing so that the shared records (request.py, scheduler_output.py) load alone.
"""
