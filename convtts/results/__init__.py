"""After the run: merge the workers' files into the outputs, draw the report, export for training libraries."""
