"""Training: the loop and its step, the loss, the schedule and optimizer, evaluation on dev
and the choice of the final weights, fine-tuning."""
