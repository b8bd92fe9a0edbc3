"""`spotnb doctor`: checks that a cloud account can run a job, before one is launched."""
