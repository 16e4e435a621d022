"""The scores a training reports, by the names its metrics.jsonl, eval.jsonl and summary use."""

METRICS = ("bleu", "chrf")
ROUGE_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# How logs, summaries and `rosetta run`'s table print each score.
LABELS = {"bleu": "BLEU", "chrf": "chrF", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L",
          "rougeLsum": "ROUGE-Lsum"}
