"""What a run reports: metrics, logs, summaries, experiment trackers."""
