"""Grouped, frozen run configuration: loaded from YAML, overridden from the command line, checked up front.

One module a concern: plan (selection, text, speakers, shards), voices (tts.*), run (workers,
output, validate), load (the whole Config, reading, overrides, printing); ConfigError in errors.
"""

from convtts.config.errors import ConfigError
from convtts.config.load import (
    PLAN_GROUPS,
    SHIPPED_CONFIG_DIRS,
    Config,
    check_piper_voices,
    dump_yaml,
    load_config,
    shipped_config,
    to_dict,
)
from convtts.config.plan import MAX_CHARS_CEILING, SelectConfig, ShardConfig, SpeakerConfig, SpokenPhrases, TextConfig
from convtts.config.run import OutputConfig, ValidateConfig, WorkerConfig
from convtts.config.voices import (
    ATTENTIONS,
    PROMPT_MODES,
    CosyVoiceConfig,
    FlowConfig,
    PiperConfig,
    PrecisionConfig,
    PromptVoice,
    SilenceConfig,
    TTSConfig,
)

__all__ = [
    "ATTENTIONS",
    "MAX_CHARS_CEILING",
    "PLAN_GROUPS",
    "PROMPT_MODES",
    "SHIPPED_CONFIG_DIRS",
    "Config",
    "ConfigError",
    "CosyVoiceConfig",
    "FlowConfig",
    "OutputConfig",
    "PiperConfig",
    "PrecisionConfig",
    "PromptVoice",
    "SelectConfig",
    "ShardConfig",
    "SilenceConfig",
    "SpeakerConfig",
    "SpokenPhrases",
    "TTSConfig",
    "TextConfig",
    "ValidateConfig",
    "WorkerConfig",
    "check_piper_voices",
    "dump_yaml",
    "load_config",
    "shipped_config",
    "to_dict",
]
