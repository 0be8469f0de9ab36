"""Optimization levels made real: torch.compile of the model (-O1) and device-graph
capture of decode batches (-O2). See DESIGN.md section 6."""
