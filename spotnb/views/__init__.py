"""What a user sees of a job: the live widget, the text view, the JupyterLab panel's server
side, the dry run's plan, the palette every view shares, and the job's diagnostics.
"""
