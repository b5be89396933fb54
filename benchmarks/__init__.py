"""Side-by-side benchmarks of Ludic against its peers; ``python -m benchmarks`` runs them all."""
