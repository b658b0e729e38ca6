"""GPU reservation pods: the binder-side service (service.py) and the reservation pod program (__main__)."""
