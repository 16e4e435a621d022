"""Language names, and the T5-style task prefix a model input starts with."""

from __future__ import annotations

# Names used in T5-style task prefixes ("translate English to German: ").
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fi": "Finnish", "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


def task_prefix(source_lang: str, target_lang: str, task: str = "translation") -> str:
    """The T5-style prefix for one example: "translate English to German: ", "summarize: "."""
    src = LANGUAGE_NAMES.get(source_lang, source_lang)
    tgt = LANGUAGE_NAMES.get(target_lang, target_lang)
    if task == "summarization":
        # T5's own prefix, so pretrained T5 checkpoints start from what they were trained on;
        # cross-lingual summaries (no T5 prefix exists) name the summary's language.
        return "summarize: " if target_lang == source_lang else f"summarize in {tgt}: "
    return f"translate {src} to {tgt}: "
