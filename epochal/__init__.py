"""epochal: derived tables declared as Spark SQL over Delta Lake, maintained incrementally."""
