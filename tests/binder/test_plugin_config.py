"""Plugin configuration: defaults, --plugins merge, order, dependency check, exact error messages."""

from __future__ import annotations

import json

import pytest

from binder.plugins.config import (
    PluginConfig,
    PluginConfigError,
    default_config,
    enabled_options,
    parse_plugins_flag,
    resolve_config,
    validate_dependencies,
)
from binder.plugins.registry import BUILDERS, build_configured_plugins, build_plugins


def names_of(plugins):
    return [plugin.name for plugin in plugins]


def test_default_plugins_run_volumebinding_dynamicresources_gpusharing_and_hamicore_is_off():
    assert names_of(build_plugins(None)) == ["volumebinding", "dynamicresources", "gpusharing"]
    assert names_of(build_plugins("")) == ["volumebinding", "dynamicresources", "gpusharing"]


def test_defaults_have_the_reference_priorities_and_arguments():
    config = default_config()
    assert config["volumebinding"] == PluginConfig(True, 300, {"bindTimeoutSeconds": "120"})
    assert config["dynamicresources"] == PluginConfig(True, 200, {"bindTimeoutSeconds": "120"})
    assert config["gpusharing"] == PluginConfig(True, 100, {"cdiEnabled": "false", "nriPluginEnabled": "false"})
    assert config["hamicore"] == PluginConfig(False, 50, None)


def test_disabling_a_plugin_removes_it():
    assert names_of(build_plugins('{"gpusharing":{"enabled":false}}')) == ["volumebinding", "dynamicresources"]


def test_enabling_hamicore_runs_it_after_gpusharing():
    plugins = build_plugins('{"volumebinding":{"arguments":{"bindTimeoutSeconds":"60"}},"hamicore":{"enabled":true}}')
    assert names_of(plugins) == ["volumebinding", "dynamicresources", "gpusharing", "hamicore"]
    assert plugins[0].bind_timeout_seconds == 60


def test_arguments_replace_the_whole_map_so_a_missing_required_one_fails_the_build():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"gpusharing":{"arguments":{"other":"x"}}}')
    assert str(error.value) == 'failed to build binder plugin gpusharing: missing argument "cdiEnabled"'


def test_empty_arguments_object_also_replaces_the_map():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"volumebinding":{"arguments":{}}}')
    assert str(error.value) == 'failed to build binder plugin volumebinding: missing argument "bindTimeoutSeconds"'


def test_null_arguments_keep_the_defaults():
    assert names_of(build_plugins('{"volumebinding":{"arguments":null,"priority":1}}'))[-1] == "volumebinding"


def test_invalid_int_argument_has_the_go_strconv_message():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"dynamicresources":{"arguments":{"bindTimeoutSeconds":"1.5"}}}')
    assert str(error.value) == ('failed to build binder plugin dynamicresources: invalid argument '
                                '"bindTimeoutSeconds"="1.5": strconv.ParseInt: parsing "1.5": invalid syntax')


def test_int_argument_out_of_int64_range():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"volumebinding":{"arguments":{"bindTimeoutSeconds":"9223372036854775808"}}}')
    assert str(error.value).endswith('parsing "9223372036854775808": value out of range')


def test_invalid_bool_argument_has_the_go_strconv_message():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"gpusharing":{"arguments":{"cdiEnabled":"yes"}}}')
    assert str(error.value) == ('failed to build binder plugin gpusharing: invalid argument '
                                '"cdiEnabled"="yes": strconv.ParseBool: parsing "yes": invalid syntax')


@pytest.mark.parametrize("text,expected", [("1", True), ("t", True), ("T", True), ("TRUE", True),
                                           ("true", True), ("True", True), ("0", False), ("f", False),
                                           ("F", False), ("FALSE", False), ("false", False),
                                           ("False", False)])
def test_cdi_enabled_accepts_every_go_parsebool_spelling(text, expected):
    plugins = build_plugins(json.dumps({"gpusharing": {"arguments": {"cdiEnabled": text}}}))
    assert plugins[-1].cdi_enabled is expected


def test_non_string_argument_is_a_flag_parse_error():
    with pytest.raises(PluginConfigError) as error:
        parse_plugins_flag('{"volumebinding":{"arguments":{"bindTimeoutSeconds":60}}}')
    assert "cannot unmarshal number" in str(error.value)


def test_malformed_json_is_a_flag_parse_error():
    with pytest.raises(PluginConfigError):
        parse_plugins_flag('{"gpusharing":')
    with pytest.raises(PluginConfigError):
        parse_plugins_flag('["gpusharing"]')
    with pytest.raises(PluginConfigError):
        parse_plugins_flag('{"gpusharing":{"enabled":"false"}}')
    with pytest.raises(PluginConfigError):
        parse_plugins_flag('{"gpusharing":{"priority":1.5}}')


def test_entry_fields_match_case_insensitively_and_unknown_fields_are_ignored():
    overrides = parse_plugins_flag('{"gpusharing":{"Enabled":false,"PRIORITY":7,"colour":"red"}}')
    assert overrides == {"gpusharing": PluginConfig(enabled=False, priority=7, arguments=None)}


def test_null_top_level_means_no_overrides():
    assert parse_plugins_flag("null") is None


def test_unknown_plugin_defaults_to_enabled_priority_zero_and_fails_to_build():
    resolved = resolve_config(default_config(), parse_plugins_flag('{"mystery":{}}'))
    assert resolved["mystery"] == PluginConfig(True, 0, {})
    with pytest.raises(PluginConfigError) as error:
        build_configured_plugins(resolved)
    assert str(error.value) == "failed to get binder plugin mystery"


def test_disabled_unknown_plugin_is_fine():
    assert "mystery" not in names_of(build_plugins('{"mystery":{"enabled":false}}'))


def test_order_is_priority_descending_then_name():
    config = {
        "b": PluginConfig(None, 5, None),
        "a": PluginConfig(True, 5, None),
        "c": PluginConfig(True, None, None),
        "d": PluginConfig(True, 9, None),
        "e": PluginConfig(False, 99, None),
        "f": PluginConfig(True, -1, None),
    }
    assert [name for name, _ in enabled_options(config)] == ["d", "a", "b", "c", "f"]


def test_equal_priorities_order_by_name():
    plugins = build_plugins('{"gpusharing":{"priority":300},"hamicore":{"enabled":false}}')
    assert names_of(plugins) == ["gpusharing", "volumebinding", "dynamicresources"]


def test_hamicore_requires_gpusharing_enabled():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"hamicore":{"enabled":true},"gpusharing":{"enabled":false}}')
    assert str(error.value) == '"hamicore" plugin requires "gpusharing" plugin to be enabled'


def test_hamicore_requires_gpusharing_present():
    config = {"hamicore": PluginConfig(None, 50, None)}
    with pytest.raises(PluginConfigError) as error:
        validate_dependencies(config)
    assert str(error.value) == '"hamicore" plugin requires "gpusharing" plugin to be enabled'


def test_hamicore_requires_gpusharing_to_run_first():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"hamicore":{"enabled":true,"priority":100}}')
    assert str(error.value) == ('"hamicore" plugin requires "gpusharing" to run before it (expected '
                                '"gpusharing".priority > "hamicore".priority, got 100 <= 100)')


def test_dependency_check_comes_before_building():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"hamicore":{"enabled":true,"priority":200},"mystery":{}}')
    assert "requires" in str(error.value)


def test_disabled_hamicore_needs_nothing():
    assert "hamicore" not in names_of(build_plugins('{"gpusharing":{"enabled":false}}'))


def test_every_reference_plugin_has_a_builder():
    reference = {"volumebinding", "dynamicresources", "gpusharing", "hamicore", "nvfractions"}  # v0.18
    # ours: the container toolkit's memory limits, gpu-fractioning's memory limit annotations
    assert set(BUILDERS) == reference | {"toolkitmemory", "nrimemory"}


def test_nrimemory_is_off_unless_its_flag_turns_it_on_and_only_in_the_configmap_modes():
    assert "nrimemory" not in names_of(build_plugins(None))
    assert names_of(build_plugins(None, nri_memory_limits=True)) == [
        "volumebinding", "dynamicresources", "gpusharing", "nrimemory"]
    assert names_of(build_plugins(None, sharing_mode="HamiCore", nri_memory_limits=True, toolkit_memory_limits=True)
                    )[-3:] == ["hamicore", "nrimemory", "toolkitmemory"]
    # NvFractions writes these annotations itself.
    assert "nrimemory" not in names_of(build_plugins(None, sharing_mode="NvFractions", nri_memory_limits=True))


def test_toolkitmemory_is_off_unless_its_flag_turns_it_on_and_runs_after_gpusharing():
    assert "toolkitmemory" not in names_of(build_plugins(None))
    assert names_of(build_plugins(None, toolkit_memory_limits=True)) == [
        "volumebinding", "dynamicresources", "gpusharing", "toolkitmemory"]
    assert names_of(build_plugins('{"hamicore":{"enabled":true}}', toolkit_memory_limits=True))[-2:] == [
        "hamicore", "toolkitmemory"]
    assert "toolkitmemory" not in names_of(build_plugins(None, sharing_mode="NvFractions",
                                                         toolkit_memory_limits=True))


def test_toolkitmemory_requires_gpusharing_enabled():
    with pytest.raises(PluginConfigError) as error:
        build_plugins('{"gpusharing":{"enabled":false}}', toolkit_memory_limits=True)
    assert str(error.value) == '"toolkitmemory" plugin requires "gpusharing" plugin to be enabled'


def test_already_decoded_overrides_are_accepted():
    overrides = parse_plugins_flag('{"hamicore":{"enabled":true}}')
    assert names_of(build_plugins(overrides))[-1] == "hamicore"


def test_repeated_arguments_keys_merge_like_go_maps():
    overrides = parse_plugins_flag('{"gpusharing":{"arguments":{"a":"1"},"Arguments":{"cdiEnabled":"true"}}}')
    assert overrides["gpusharing"].arguments == {"a": "1", "cdiEnabled": "true"}
    overrides = parse_plugins_flag('{"gpusharing":{"arguments":{"a":"1"},"arguments":null}}')
    assert overrides["gpusharing"].arguments is None


def test_repeated_plugin_entries_replace_each_other():
    overrides = parse_plugins_flag('{"gpusharing":{"priority":5},"gpusharing":{"enabled":false}}')
    assert overrides == {"gpusharing": PluginConfig(enabled=False, priority=None, arguments=None)}
