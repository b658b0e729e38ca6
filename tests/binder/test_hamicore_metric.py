"""hamicore's skipped-limit counter lives in the registry it was asked for, however many registries come and go."""

import gc

from prometheus_client import CollectorRegistry

from binder.plugins.hamicore.plugin import limit_skipped_counter


def test_each_new_registry_gets_its_own_counter_even_at_a_reused_address():
    # Until a registry is made at an address a collected one had, and a few times more (each gc.collect() costs
    # tenths of a second in a full test session's heap).
    seen: set[int] = set()
    reused = 0
    for _ in range(100):
        registry = CollectorRegistry()
        reused += id(registry) in seen
        seen.add(id(registry))
        limit_skipped_counter(registry).labels("node_label_missing").inc()
        assert registry.get_sample_value("fracgpu_binder_hamicore_limit_skipped_total",
                                         {"reason": "node_label_missing"}) == 1
        del registry
        gc.collect()
        if reused >= 3:
            break
    assert reused >= 3, "no registry was ever made at a collected one's address: the test proves nothing"
