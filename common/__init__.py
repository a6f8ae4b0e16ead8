"""What both sides of stabledrl need: config, sample types, model families, attention layouts,
likelihood estimators, tasks and rewards, metrics."""
