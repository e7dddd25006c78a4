"""The optimisation workflow: Target, baseline, variants, paired experiments, champion, audit."""
