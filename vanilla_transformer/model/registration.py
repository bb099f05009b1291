"""The model type `vanilla_transformer` made known to transformers in this process (`vanilla_transformer.register()`).

`register_model` registers its config, its two model classes under the Auto classes, and its "translation"
pipeline, once a process."""

import functools

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel
from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline


@functools.cache
def register_model() -> None:
    """Register once per process; a second call does nothing."""
    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
    PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=VanillaTransformerTranslationPipeline, pt_model=AutoModelForSeq2SeqLM
    )
