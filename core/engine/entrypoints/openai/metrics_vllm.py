"""``--metrics-compat vllm``: every ``engine:`` metric also under vLLM's ``vllm:`` name.

Routers and autoscalers built for vLLM read its metric names: llm-d's inference scheduler
and the Gateway API Inference Extension pick a replica by ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (older releases: ``vllm:gpu_cache_usage_perc``) and
``vllm:lora_requests_info``; KServe and KEDA scale on the queue gauges; dashboards chart the
prefix-cache counters and the latency histograms. With the flag, each scrape re-exports
every ``engine:`` family under the ``vllm:`` prefix with vLLM's labels::

    engine:num_requests_waiting{model_name}     ->  vllm:num_requests_waiting{model_name,engine}
    engine:request_success_total{finish_reason} ->  vllm:request_success_total{finished_reason}

plus what only vLLM names: ``vllm:gpu_cache_usage_perc`` and
``vllm:time_per_output_token_seconds`` (the older names of two families),
``vllm:cache_config_info`` (block size, block count); ``vllm:lora_requests_info`` keeps
vLLM's exact label set (``max_lora``, running and waiting adapters; no ``engine`` label),
its value the scrape time as vLLM's is. The values are the same objects the ``engine:``
series read, so the two never disagree within one scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.entrypoints.openai.metrics import StatsFn, lora_requests_info

SOURCE_PREFIX = "engine:"
VLLM_PREFIX = "vllm:"
_LABEL_NAMES = {"finish_reason": "finished_reason"}
# Families vLLM also exports under an older name that deployed routers still read.
_ALIASES = {
    "kv_cache_usage_perc": "gpu_cache_usage_perc",
    "inter_token_latency_seconds": "time_per_output_token_seconds",
}


def _renamed(family: Metric, suffix: str, engine_index: str) -> Metric:
    """A copy of ``family`` named ``vllm:<suffix>`` with vLLM's label names."""
    name = VLLM_PREFIX + suffix
    out = Metric(name, family.documentation, family.type, family.unit)
    for sample in family.samples:
        sample_suffix = sample.name[len(family.name) :]  # _total, _bucket, _sum, ...
        labels = {_LABEL_NAMES.get(k, k): v for k, v in sample.labels.items()}
        labels["engine"] = engine_index
        out.add_sample(name + sample_suffix, labels, sample.value, sample.timestamp)
    return out


class VllmCompatCollector(Collector):
    """Re-exports a registry's ``engine:`` families under vLLM's names at scrape time."""

    def __init__(
        self,
        source: CollectorRegistry,
        stats_fn: StatsFn,
        cache_config: dict[str, str],
        engine_index: int = 0,
    ) -> None:
        self.source = source
        self.stats_fn = stats_fn
        self.cache_config = dict(cache_config)
        self.engine_index = str(engine_index)

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if not family.name.startswith(SOURCE_PREFIX):
                continue
            suffix = family.name[len(SOURCE_PREFIX) :]
            if suffix == "lora_requests_info":
                continue  # re-exported below with vLLM's labels only
            yield _renamed(family, suffix, self.engine_index)
            if suffix in _ALIASES:
                yield _renamed(family, _ALIASES[suffix], self.engine_index)
        yield self._cache_config_info()
        yield self._lora_requests_info()

    def _cache_config_info(self) -> Metric:
        labels = dict(self.cache_config)
        try:
            labels["num_gpu_blocks"] = str(self.stats_fn().num_total_blocks)
        except Exception:  # a dead engine must not break /metrics
            labels["num_gpu_blocks"] = ""
        labels["engine"] = self.engine_index
        names = sorted(labels)
        info = GaugeMetricFamily(
            VLLM_PREFIX + "cache_config_info", "Information of the KV cache configuration.",
            labels=names,
        )  # fmt: skip
        info.add_metric([labels[n] for n in names], 1.0)
        return info

    def _lora_requests_info(self) -> Metric:
        try:
            stats = self.stats_fn()
        except Exception:  # a dead engine must not break /metrics
            stats = None
        return lora_requests_info(VLLM_PREFIX, stats)


def cache_config_labels(engine_args: Any) -> dict[str, str]:
    """The static labels of ``vllm:cache_config_info`` (vLLM's label names)."""
    return {
        "block_size": str(engine_args.block_size),
        "cache_dtype": str(engine_args.kv_cache_dtype),
        "enable_prefix_caching": str(bool(engine_args.enable_prefix_caching)),
        "gpu_memory_utilization": str(engine_args.gpu_memory_utilization),
    }


def vllm_compat_registry(
    source: CollectorRegistry, stats_fn: StatsFn, engine_args: Any
) -> CollectorRegistry:
    """A registry to render after ``source``: its families under vLLM's names."""
    registry = CollectorRegistry()
    registry.register(VllmCompatCollector(source, stats_fn, cache_config_labels(engine_args)))
    return registry


__all__ = [
    "VllmCompatCollector",
    "cache_config_labels",
    "vllm_compat_registry",
]
