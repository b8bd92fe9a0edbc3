"""What drives a job from the notebook machine: the controller (launch, watch, recover,
relaunch), the fleet controller for several instances, the supervisor that keeps controllers
alive, the job DB and the store lease that fences two controllers of one job.
"""
