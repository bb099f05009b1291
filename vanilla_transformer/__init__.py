"""Training library for vanilla-transformer (never copied to the Hub).

Importing it makes transformers know the model type `vanilla_transformer` in this process: the Auto classes, so that
the library and its commands load model folders with the installed code (`AutoModelForSeq2SeqLM.from_pretrained(
folder)`, no `trust_remote_code`), and the "translation" pipeline, which transformers 5 no longer has and whose
registration makes a saved folder's config.json name it under `custom_pipelines`. The Hub-facing files register
nothing: a Hub user's folder names its classes in `auto_map` and `custom_pipelines`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel
from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
PIPELINE_REGISTRY.register_pipeline(
    "translation", pipeline_class=VanillaTransformerTranslationPipeline, pt_model=AutoModelForSeq2SeqLM
)
