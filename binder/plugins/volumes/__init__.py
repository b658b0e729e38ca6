"""Volume binding for the volumebinding plugin: pure decisions (matching, plan) and the API steps (apply)."""
