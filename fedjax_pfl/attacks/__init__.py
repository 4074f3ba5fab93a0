"""Attacks: the malicious set, label poisoning (A1), random updates (A2), model
replacement (A3); composable with every algorithm and aggregator."""

from ._attacks import ATTACKS as ATTACKS
from ._attacks import ThreatModel as ThreatModel
from ._attacks import UpdateAttack as UpdateAttack
from ._attacks import attack_update as attack_update
from ._attacks import attack_updates as attack_updates
from ._attacks import gaussian_updates as gaussian_updates
from ._attacks import malicious_clients as malicious_clients
from ._attacks import model_replacement as model_replacement
from ._attacks import poison_labels as poison_labels
from ._attacks import setup_attack as setup_attack
from ._backdoor import CIFAR_BACKDOOR as CIFAR_BACKDOOR
from ._backdoor import backdoor_success as backdoor_success
from ._backdoor import semantic_backdoor as semantic_backdoor
from ._backdoor import target_backdoor as target_backdoor
