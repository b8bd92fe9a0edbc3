"""Integrations with training frameworks; each is imported on demand (`spotnb.integrations.hf`),
so `import spotnb` never imports a framework."""
