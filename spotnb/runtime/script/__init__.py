"""Scripts as jobs: the runner that supervises a user's script on the instance and the
client (`spot.ctx()`) the script talks to the agent with.
"""
