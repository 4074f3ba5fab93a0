"""Hash registry, verified reads, downloads and a status table for the real datasets.

Every file a loader reads is checked against :data:`REGISTRY` (sha256, or the sha256
of the decompressed content for IDX ``.gz`` files, so any gzip container of the
canonical bytes verifies; md5 only where upstream publishes nothing else, as for the
CIFAR-10 python batches). A missing, truncated, corrupt or mismatched file raises
:class:`DatasetError` naming the file and where to obtain it, before anything is
returned. Local data lives under ``$FEDJAX_PFL_DATA_DIR`` (see ``docs/datasets.md``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

DATA_DIR_ENV = "FEDJAX_PFL_DATA_DIR"
CACHE_DIR_ENV = "FEDJAX_PFL_CACHE_DIR"


class DatasetError(ValueError):
    """A dataset file is missing, truncated, corrupt or fails its hash check."""


class FileSpec(NamedTuple):
    """What one file must contain.

    Attributes:
      digest: hex digest.
      size: expected bytes (of the decompressed content for ``gunzip-sha256``).
      kind: ``"sha256"`` of the file, ``"gunzip-sha256"`` of its gzip content, or
        ``"md5"`` of the file (only where upstream publishes md5 alone).
    """

    digest: str
    size: int | None = None
    kind: str = "sha256"


class DatasetInfo(NamedTuple):
    """A dataset: its folder, alternative file layouts and where to get it."""

    name: str
    subdir: str
    layouts: dict[str, tuple[str, ...]]  # layout -> paths relative to data_dir
    summary: str
    obtain: str


# sha256, bytes, path (relative to the data dir) of every local non-IDX file.
_SHA256_TABLE = """
78ee570a613b69b89507acf63e7adfb6c820d5cebd0aa35524d513fdd19b66d7 956298 celeba_leaf_ditto/raw/identity_CelebA.txt.gz
928145e7833f0beb33edb7e11962cf0c6ca2d21760c769900c46fcbfc2126203 14036 celeba_leaf_ditto/test/all_data_niid_1_keep_25_test_8.json.gz
975af4d41d4abe1d014384093dc0f043a3df8dd526bd36b6e21db8fdbda91a8f 39777 celeba_leaf_ditto/train/all_data_niid_1_keep_25_train_8.json.gz
9b372f03b5a7a82e9b5bc092f693eb663a3a10672429abc6bed76959189d80b6 2043 cifar10/missing.tsv
735ab97315f54634215f6b54d27841034771c3d58a73faa8b680035d55930d28 20060 cifar10/test_rank.npy
070ab7d6f1054a762659ec2ed5c26d9cea3c5ec04bdac0fe16f04822ae2457ba 23104824 cifar10/test_x.npy.xz
144d530f629359e4aaeffe69332f2cdf978f7eb87c87e46ade125b5c145f95a6 10094 cifar10/test_y.npy
90194da8211a37d259519f00e61880b60164248586a06c92f4035c9c2e769bce 99874 cifar10/train_rank.npy
4c85db05252f9043214854bf998fe45e5caeb31978761d09cef3329041482f67 115762192 cifar10/train_x.npy.xz
dae7a1202fe209895d2a48d9b3cdad6ced94107bec39df9dca2bea0fa58a61fa 50001 cifar10/train_y.npy
864025e85c33cbccdb49bd949d2cb8e9053b7bac9447d23ab68b9c54051b71de 18227 femnist_leaf/arakotom_flic/test/all_data_0_niid_05_keep_0_test_9.json.gz
bc9a53cc24f825c8b252b5e4a18701bb1709f0e315010f2d480a78c5a2983a15 22037 femnist_leaf/arakotom_flic/test/all_data_10_niid_05_keep_0_test_9.json.gz
e1e958c33d5e1c41333d75a8d3c6c32393d0caaaf7a62d488e321ad34df4f8ea 22009 femnist_leaf/arakotom_flic/test/all_data_16_niid_05_keep_0_test_9.json.gz
fc6c1685016c08296270d738fadcb6b9c0dd9e15720803bc8af26a28d0bb6677 19997 femnist_leaf/arakotom_flic/test/all_data_17_niid_05_keep_0_test_9.json.gz
556fc9fb04614302948a1e1f6d85ca2bcce6703568d80c85633eb9b96ca0bc71 21624 femnist_leaf/arakotom_flic/test/all_data_18_niid_05_keep_0_test_9.json.gz
fbd3c841fa90f08a4f0d1dbe8544c10cbff5c4b1714d16a7212cbb5dbe5824a0 19549 femnist_leaf/arakotom_flic/test/all_data_19_niid_05_keep_0_test_9.json.gz
9b841d70be042610141e47b7853d428a76935c4483ea33d2cd8444bb973825a9 18767 femnist_leaf/arakotom_flic/test/all_data_1_niid_05_keep_0_test_9.json.gz
c81d58b1392f72aa91e4de39a50af58cd67f0a7a1b58357e9fc19c4086f464c1 21616 femnist_leaf/arakotom_flic/test/all_data_20_niid_05_keep_0_test_9.json.gz
17855130da8fe25e5acd76e4b4d4c2717822a82e2dd88c444370413e32b5782d 20575 femnist_leaf/arakotom_flic/test/all_data_27_niid_05_keep_0_test_9.json.gz
1eda5e2f0691ca4e39464c0bada096caf1d63b40304cc504155e81d1ccc4d09e 21994 femnist_leaf/arakotom_flic/test/all_data_28_niid_05_keep_0_test_9.json.gz
dd034bc670b245c854a64a2d606b9650b9d2ee1bfe0e03786e3026231aaa30fd 23229 femnist_leaf/arakotom_flic/test/all_data_29_niid_05_keep_0_test_9.json.gz
bba4d3337cc278991ddc6ebcca8a3b2cd61fc5201441fcf7c9af59a9ba439305 17807 femnist_leaf/arakotom_flic/test/all_data_2_niid_05_keep_0_test_9.json.gz
694992596261398872ebc2aba564124ba5ee1b59c26ccb42cada99051f2fd316 20130 femnist_leaf/arakotom_flic/test/all_data_30_niid_05_keep_0_test_9.json.gz
fe3bee67f730ae596133850c0023e60369ea61d071c548908ac1383fdfe09759 18435 femnist_leaf/arakotom_flic/test/all_data_3_niid_05_keep_0_test_9.json.gz
51d83ce2225b96bc0be0443328a929c3e9dd1035a7902dd8ed41e2429fce2e90 18085 femnist_leaf/arakotom_flic/test/all_data_4_niid_05_keep_0_test_9.json.gz
7548e0972758415213934a46c5ecc45156c13cc0085d4883193993c2cd215eeb 19290 femnist_leaf/arakotom_flic/test/all_data_5_niid_05_keep_0_test_9.json.gz
d0b44512e4a9c713ac0ae33953c3745817a4bbd193334a1ed7245b19e34e5ae9 22385 femnist_leaf/arakotom_flic/test/all_data_6_niid_05_keep_0_test_9.json.gz
7e66298023fb9d6920a0aa298d70ac683e9c116365183c8cf5e89e6542d2babc 23320 femnist_leaf/arakotom_flic/test/all_data_7_niid_05_keep_0_test_9.json.gz
591649272df88af67238844ed576776e8f738c574f8eaf1efbe5cedef22de061 20478 femnist_leaf/arakotom_flic/test/all_data_8_niid_05_keep_0_test_9.json.gz
45b3ddb66971421e7e349141070a04c7d3cc99e9d0b4ffca7340387327c7bd70 21188 femnist_leaf/arakotom_flic/test/all_data_9_niid_05_keep_0_test_9.json.gz
dccc269557444a97f39d3ac90f146c5da53d927a3be59e7d3c09eecdb25e14c9 152325 femnist_leaf/arakotom_flic/train/all_data_0_niid_05_keep_0_train_9.json.gz
bdb89d50070f44fe3322df02bc91057928959a5de432ae092ec8223412ef40a0 173655 femnist_leaf/arakotom_flic/train/all_data_10_niid_05_keep_0_train_9.json.gz
c04118bbe470fc0f9a5b37088b7bc834f3ec1663bf3244d4b646cf410cbe2cef 185599 femnist_leaf/arakotom_flic/train/all_data_16_niid_05_keep_0_train_9.json.gz
8b2cf315440100a150feab4451e67fc5da0b2a093b459f66ac8e401a6f89b17c 166141 femnist_leaf/arakotom_flic/train/all_data_17_niid_05_keep_0_train_9.json.gz
28fea7b4d0aef90d18b1b9fd3612e1bbd04b00e08f315d7e73a10a0affafe516 172400 femnist_leaf/arakotom_flic/train/all_data_18_niid_05_keep_0_train_9.json.gz
8d8e28ab6ca198a42f8582cf184e2ea8bb99d54dda3795b9b433e2fec2d80676 160102 femnist_leaf/arakotom_flic/train/all_data_19_niid_05_keep_0_train_9.json.gz
2a368fb9f336946541efc230ddb6472c6a31fe6c94a9fb6d01ad40923f157908 146053 femnist_leaf/arakotom_flic/train/all_data_1_niid_05_keep_0_train_9.json.gz
fb7ef12fcd849680bae6b05c1a4c3f7ddacb8b4fca4d81eaef6025b0c76ee32b 183274 femnist_leaf/arakotom_flic/train/all_data_20_niid_05_keep_0_train_9.json.gz
7743a9a6ce16d560b4aff1302b00a5bac3b75cc79f1f0a39daee4b0e8b5f49dc 174217 femnist_leaf/arakotom_flic/train/all_data_27_niid_05_keep_0_train_9.json.gz
514101185756fcfc7632fe2c73ae8315e4afd5b267efb7c89c03464e999b48dc 184450 femnist_leaf/arakotom_flic/train/all_data_28_niid_05_keep_0_train_9.json.gz
d8ebfbd79d1300b26cba76ba6cb5e72fdacbd36c5dbf0e1785a07f6e5847ecf0 193623 femnist_leaf/arakotom_flic/train/all_data_29_niid_05_keep_0_train_9.json.gz
03a3fff9963e14dd8fd351cd260440fca0d09e66491a0fa76e660d8e66028afa 141964 femnist_leaf/arakotom_flic/train/all_data_2_niid_05_keep_0_train_9.json.gz
a9a9b49ddd0b35ed5830b2421bc3725d523b07882ed892d84f3689c52353edd8 167027 femnist_leaf/arakotom_flic/train/all_data_30_niid_05_keep_0_train_9.json.gz
aa559e37a44371e236cb9ce7fcabfb12357ed7f208ef87ca8b9624410a194300 148338 femnist_leaf/arakotom_flic/train/all_data_3_niid_05_keep_0_train_9.json.gz
506ed1653046f66e0783ed759b791a7488672e3a5e738094ebe9856f655e3a05 154406 femnist_leaf/arakotom_flic/train/all_data_4_niid_05_keep_0_train_9.json.gz
4c2d0884b741cf00ffcb8a895bba39a5e4f7b6f403e8fb6bece1d3d3e8aa06a9 150656 femnist_leaf/arakotom_flic/train/all_data_5_niid_05_keep_0_train_9.json.gz
e0446e31caa19432d738ed176962a1b56e48769cb924bccf0f0e8841cbf790a1 181168 femnist_leaf/arakotom_flic/train/all_data_6_niid_05_keep_0_train_9.json.gz
c4429098b8433d85c65c8579b654830b6a3d61d04f22f25e310ba70bc701158a 189978 femnist_leaf/arakotom_flic/train/all_data_7_niid_05_keep_0_train_9.json.gz
45dae8e91d073a87cfd31a5fe9aebc5bac91207123aa261739bd9c75caa2bfec 176223 femnist_leaf/arakotom_flic/train/all_data_8_niid_05_keep_0_train_9.json.gz
e0d38013b7879b0cbb06ed82478562ab6e1357aac51d99a737da40474a77af46 181439 femnist_leaf/arakotom_flic/train/all_data_9_niid_05_keep_0_train_9.json.gz
9d66184d85fe4b5c8b778200aa2104cebd54d301a891e9cc1fefbabae6af8c3c 21029 femnist_leaf/slz-ai_leaf-torch/test/all_data_0_niid_05_keep_0_test_9.json.gz
8fc955e360eb17085c1de0ff6d1bddd06b303a9671eb74da5fba879095043bc8 19147 femnist_leaf/slz-ai_leaf-torch/test/all_data_10_niid_05_keep_0_test_9.json.gz
2af611c8110828a7be3ba2a883d640795de0ff63f9f519d10b709490d84cce32 19766 femnist_leaf/slz-ai_leaf-torch/test/all_data_16_niid_05_keep_0_test_9.json.gz
db7b314ad3503b4ae71c6fa444695676f1ab4e83cf9ad09174a2b90432d46583 20204 femnist_leaf/slz-ai_leaf-torch/test/all_data_17_niid_05_keep_0_test_9.json.gz
a314a3b3149af9b6ed9f60244dabd49d491d87dd400a64e5be8edb36072bb94a 18805 femnist_leaf/slz-ai_leaf-torch/test/all_data_18_niid_05_keep_0_test_9.json.gz
5cd29730fa4d751d441bc639a4f13eaf142fda7e414c2b4f7ee352621f741d21 19674 femnist_leaf/slz-ai_leaf-torch/test/all_data_19_niid_05_keep_0_test_9.json.gz
f5648c5aa87df93661efadbc3d5bc8d1e2774f313060b911b3e02ce3e2546400 20039 femnist_leaf/slz-ai_leaf-torch/test/all_data_1_niid_05_keep_0_test_9.json.gz
e2f3117efe372517fa77df090659df3f87fe2ec22c5faf814e25c0b36cf764b7 19551 femnist_leaf/slz-ai_leaf-torch/test/all_data_20_niid_05_keep_0_test_9.json.gz
7603f84bfec06939c01226bd5feb6dca0a3204f93f0d15d4a89b584236a9d872 19870 femnist_leaf/slz-ai_leaf-torch/test/all_data_2_niid_05_keep_0_test_9.json.gz
45e294bf53b2b6a3e634076f5bc34ad4ccee1ca1dbbcc8f72dd653dc393e9d9a 20897 femnist_leaf/slz-ai_leaf-torch/test/all_data_31_niid_05_keep_0_test_9.json.gz
f29eefe78403068a9ef6401f3a731147dbb2c73372d458363d13a443853d7106 20533 femnist_leaf/slz-ai_leaf-torch/test/all_data_32_niid_05_keep_0_test_9.json.gz
d48f94b362f57c45fb7e8b067312a44452f4acc43d75df9af01683d677612f32 20073 femnist_leaf/slz-ai_leaf-torch/test/all_data_33_niid_05_keep_0_test_9.json.gz
738587dc02de1cffbe65fdde28f9455fa477f935b0611a76caa04892d5a62955 20910 femnist_leaf/slz-ai_leaf-torch/test/all_data_34_niid_05_keep_0_test_9.json.gz
42b54b50ed36621b03a780a750d159c3060204645fc2f0bebf6a428806888c50 22127 femnist_leaf/slz-ai_leaf-torch/test/all_data_3_niid_05_keep_0_test_9.json.gz
c8243e50b5a12fd9408a2200c53d240853f36cd7a88467a55d9c0ea19c5996ec 19010 femnist_leaf/slz-ai_leaf-torch/test/all_data_4_niid_05_keep_0_test_9.json.gz
ed8dada6f9ad1d93c4fd5f6e9f6955fddee5e1fe2e93fddca5939e5a46637011 18072 femnist_leaf/slz-ai_leaf-torch/test/all_data_5_niid_05_keep_0_test_9.json.gz
8fc9c6a629860d43c45948b45e6027f21d2706ee34173498381214fa2e1b8a6e 18115 femnist_leaf/slz-ai_leaf-torch/test/all_data_6_niid_05_keep_0_test_9.json.gz
2a2bf4f5180b7fcb0370767fa90fc1fb1705ef7362780ad83f6875a7ac914f4e 17728 femnist_leaf/slz-ai_leaf-torch/test/all_data_7_niid_05_keep_0_test_9.json.gz
7aa09436c0b3e66a2273aa2369a081d27c8c1b574683d1e704a69ca2e3bff153 19157 femnist_leaf/slz-ai_leaf-torch/test/all_data_8_niid_05_keep_0_test_9.json.gz
9018adb140700c0825133427b6a5ad1b109c8891bffda087dd6e02f893d6b955 20223 femnist_leaf/slz-ai_leaf-torch/test/all_data_9_niid_05_keep_0_test_9.json.gz
65ed15c9d28a1040fa548a1ef50f05143a12d51a8c2733a97a99d5d26006c793 177900 femnist_leaf/slz-ai_leaf-torch/train/all_data_0_niid_05_keep_0_train_9.json.gz
b1d6c3f2afb17dab6e35437b2258bc495267f3bb7a7f3424ecb650a24ceac3ca 158636 femnist_leaf/slz-ai_leaf-torch/train/all_data_10_niid_05_keep_0_train_9.json.gz
e4f542f343cb4d49f3b29744be33572d07477d06e651882c67dd4e42083af7eb 168061 femnist_leaf/slz-ai_leaf-torch/train/all_data_16_niid_05_keep_0_train_9.json.gz
6587d6c7f8d80ad30ee56040e658e06a598a54028424e904a74fcce225d6b6b7 166002 femnist_leaf/slz-ai_leaf-torch/train/all_data_17_niid_05_keep_0_train_9.json.gz
b642e698f9876fa7b983a33d135a4c2c136f1789b6a50fb92564cf1315951daa 160760 femnist_leaf/slz-ai_leaf-torch/train/all_data_18_niid_05_keep_0_train_9.json.gz
9499ebf63b6b555b6d352587b67477be9b455a7a101f54179f6d9f71ce08912c 168483 femnist_leaf/slz-ai_leaf-torch/train/all_data_19_niid_05_keep_0_train_9.json.gz
655d6af73e5656d52f3044e1bf1e1e0c43b198b65b956d859ff84c1301accab6 169301 femnist_leaf/slz-ai_leaf-torch/train/all_data_1_niid_05_keep_0_train_9.json.gz
faae255e347628814398767ec52971be41feeb82f1969174f4e9b447d30a3afa 161223 femnist_leaf/slz-ai_leaf-torch/train/all_data_20_niid_05_keep_0_train_9.json.gz
8e983279df0f912b0c615d7604c9e2c9e5a2e1215fe19a44dac17a3dfcbf3d71 174007 femnist_leaf/slz-ai_leaf-torch/train/all_data_2_niid_05_keep_0_train_9.json.gz
fc51d3a869b3cfd5b4f705f86a8d5561527db3040de307550823297e54157c84 176852 femnist_leaf/slz-ai_leaf-torch/train/all_data_31_niid_05_keep_0_train_9.json.gz
53f22736f443d2bbe6452f0dcde7349f4cc77f559a3f15b08160f67d24c6de22 169447 femnist_leaf/slz-ai_leaf-torch/train/all_data_32_niid_05_keep_0_train_9.json.gz
22f9c9e7fb9d51191460b808f79492bef10e61ec1b7ec008802001bc3100e25a 164403 femnist_leaf/slz-ai_leaf-torch/train/all_data_33_niid_05_keep_0_train_9.json.gz
3607b26a9f914d8ae173053d18585ea1c0beeb6a4dbf39f9e6496bcd942a421d 175416 femnist_leaf/slz-ai_leaf-torch/train/all_data_34_niid_05_keep_0_train_9.json.gz
ae4422e5a94cc9b8017800be56c858f876724402c82c7b80acbb78b9265af913 186409 femnist_leaf/slz-ai_leaf-torch/train/all_data_3_niid_05_keep_0_train_9.json.gz
22477a3b8562e3bea6e7adc711bc903fd9725aad1df9ab8116d40590bdb36576 162232 femnist_leaf/slz-ai_leaf-torch/train/all_data_4_niid_05_keep_0_train_9.json.gz
03a2c11423cccc5805d11bb8e647d08ecf3030e0b92ecaf3ecffb73df496c1b0 154519 femnist_leaf/slz-ai_leaf-torch/train/all_data_5_niid_05_keep_0_train_9.json.gz
89dfc8c110c0284a598a0891865652206d8995b2f3e6bdf7a7fd39ff8107fd6b 154082 femnist_leaf/slz-ai_leaf-torch/train/all_data_6_niid_05_keep_0_train_9.json.gz
44e7e44ea1f2b0a45290040b00308c7d3897cdd474b699854bd4a43321c8695a 151678 femnist_leaf/slz-ai_leaf-torch/train/all_data_7_niid_05_keep_0_train_9.json.gz
6877848fc7a78f4a7f9487c076d30794cb0ba490803800e49d666c9c59ddab34 161614 femnist_leaf/slz-ai_leaf-torch/train/all_data_8_niid_05_keep_0_train_9.json.gz
7861c6e65e50744dddd8863d92fb88379b00d96fe4d89ee64aad0d3d2699b030 171699 femnist_leaf/slz-ai_leaf-torch/train/all_data_9_niid_05_keep_0_train_9.json.gz
170f5d6c9e3bcb7202cd7d9aaa42ad7c204657ea284610013cd2cc11a6951370 20185 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_10_niid_05_keep_0_test_9.json.gz
8327329c6456f26380195343130233be03e8b2f1cfe45736ada807f8e7d12b2e 22500 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_11_niid_05_keep_0_test_9.json.gz
d4f009daa8d6c15151305a2b4aba373c3fcbb4be49ba6724fcf0e73f100759f0 21676 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_12_niid_05_keep_0_test_9.json.gz
bb03c4a6009821c6214e731aa3a44d5312eb1df3b7dface9b896ddd5ced21a34 21725 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_14_niid_05_keep_0_test_9.json.gz
f60f66889d5add0ae704be791c50c14525f9a7b9f2c6f5342a4614a153620bd3 18041 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_20_niid_05_keep_0_test_9.json.gz
100d3ba9ea98e47f7bde4729e8a44fbc6484bbf66b62b297f49368d35bd1f463 21402 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_21_niid_05_keep_0_test_9.json.gz
aede9c977c11c3e86a5da96dbbf2371f8102f5e671157a53dd4310dc412e61e0 18290 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_22_niid_05_keep_0_test_9.json.gz
75e6d1bd174bcdc83f3af828edd401e1fe5fa819430ae4d056a4730a1e159474 20043 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_23_niid_05_keep_0_test_9.json.gz
3715285f47d5532ad94ce22ccd21be3c7b3168b39b6c2b00a9a88a361330a598 20379 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_24_niid_05_keep_0_test_9.json.gz
2e3d89578a1c2125d8f8e654b9105648fb391b4d14295055434251b25384f718 17130 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_30_niid_05_keep_0_test_9.json.gz
3f5ceff68c7a7249b9379e1200ba5aae8734d9be93e80435bddb90347a976cf7 18307 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_31_niid_05_keep_0_test_9.json.gz
34a4d284e59a96e570c2cbbd38b8a7b460b709cb168e22a02e4a43023a5babdc 18990 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_32_niid_05_keep_0_test_9.json.gz
4d82b9b600a17680ada0e529680617d947b1c06e9eaf107b382090513bc436ff 18656 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_33_niid_05_keep_0_test_9.json.gz
8afcdef1fd50dcd1bd7f9f90acf273321c0949506a49555b11e751f7e5e2374c 17896 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_34_niid_05_keep_0_test_9.json.gz
620c3e5f00439203f905e2ddd0dc6a26738cd2b14880aff95b548e7c26d2fd24 17401 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_35_niid_05_keep_0_test_9.json.gz
63a637a938a68095fd9e3cfbcdffa03eb46dba1fe928487544a582c55cd43c25 20190 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_5_niid_05_keep_0_test_9.json.gz
0b7dfcb16036469d674b3c0b454366396917af128594b17d8a6a5cfd63852b09 21190 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_6_niid_05_keep_0_test_9.json.gz
34af135488274550c98f33fa1c50a1fd17dc8708899cb99aff65e709b42ee58d 19695 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_7_niid_05_keep_0_test_9.json.gz
f4a975fc5b42f843c7fefb9fdc140d8abfa9a7d4bba5ed3d7eb0772469aad0d2 20458 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_8_niid_05_keep_0_test_9.json.gz
bcc1eb4071b400bc3b7da87811a70550055cf962320e4876330318b3dbd64efa 20273 femnist_leaf/wenzhu23333_Federated-Learning/test/all_data_9_niid_05_keep_0_test_9.json.gz
ee02e929bbb4b65d04f62beaaee9727ad6167fe145bfbaa9d60b19d96c9851f2 172490 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_10_niid_05_keep_0_train_9.json.gz
5a27f9780b09ee9137044aa29e204190da177b7f76d0a3baa737977dcc6da648 192449 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_11_niid_05_keep_0_train_9.json.gz
fefcc714d9ed55534e099e1a3249889de5192a3e0e55fb83e6db00cf23f0b1b5 179198 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_12_niid_05_keep_0_train_9.json.gz
75fce65a74fdfa5dfec83dc3a83dc4e9a9ec51277546b9963709e2feae8e085a 188321 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_14_niid_05_keep_0_train_9.json.gz
8a29ccb536f02f00d233e74b19588eeed92163cf158f22b37c0fe54fac4c0595 152847 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_20_niid_05_keep_0_train_9.json.gz
034ac75b90595cb01c8572676020236c2eda44435b32b94a4ced914b92a79e24 178320 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_21_niid_05_keep_0_train_9.json.gz
03ad8f36638c2d8b1f13c128c0ffb85576b181d68451349df3adf3595fd821ff 154572 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_22_niid_05_keep_0_train_9.json.gz
5fa6deb681cf98dd4b7d73aeb74a3fc5c30057fbf18055e792d194f921ddc8fc 166942 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_23_niid_05_keep_0_train_9.json.gz
976ebfc24228d096f02c0e6a8425717660a6a16fc8694e289149391000d72f6f 174505 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_24_niid_05_keep_0_train_9.json.gz
16da0a10eb6c9e7c64b132951b7b691e5ccee46ce280cd6a9426bd2c01afae75 150781 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_30_niid_05_keep_0_train_9.json.gz
647d9aed53433591d75705a22d60480eaa9830f2366be63360bd80e1f086a817 155458 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_31_niid_05_keep_0_train_9.json.gz
4ce7f3f5fd2a1860af0ce36e78fe65c2a8644e3fd6e7914c5e38643bc7faebfe 163434 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_32_niid_05_keep_0_train_9.json.gz
48d96cb9ead4c65830e50c2537db21e1fa550ec3d8dc260f49556eb04b575f4d 154581 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_33_niid_05_keep_0_train_9.json.gz
0273ca3a585d977c7a030fffb874c51daed49a303e71dfd64c0410a96a8fe45a 148760 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_34_niid_05_keep_0_train_9.json.gz
3c3bd80a5669f4f1481a925a2f94ced99a918a44df7d58d587d21650afe75b42 146322 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_35_niid_05_keep_0_train_9.json.gz
3ec73aa68f5bbb180d9541c7d4b73ee640f2b577dc99b48e487255d21d7e5414 174819 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_5_niid_05_keep_0_train_9.json.gz
1466d7fb900a13345cc277d5e8a7ff2db58776279b2c601578ae6492b083306b 176769 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_6_niid_05_keep_0_train_9.json.gz
d14f1344374b221202a362e64d8688b0d48c0625eae10d134425a99889e9f6aa 159472 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_7_niid_05_keep_0_train_9.json.gz
c78f19e456ac8a91f1a87cf9a5e89a342137de8ece94d046adc27eb5db8b23df 180055 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_8_niid_05_keep_0_train_9.json.gz
3b5ad2b44820b261b889bd96ab5b0b5cf3e1850378f8f366c2c03904ffd78d16 170246 femnist_leaf/wenzhu23333_Federated-Learning/train/all_data_9_niid_05_keep_0_train_9.json.gz
8fd7a26b2e2a2cb84a75a892d73d3584554de17a74336d57de3faea108a0c3a3 28758 femnist_leaf/writers.tsv
1ae7f06e9096ff1585500262558d72ac41165b76c1e84731cf9d8d074466a93a 1699139 vehicle_ditto/train/mytrain.json.gz
86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed 1115394 tinyshakespeare/input.txt
"""

# sha256 and bytes of the decompressed IDX content (upstream md5s verified).
_IDX_TABLE = """
5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b 7840016 fashion_mnist/t10k-images-idx3-ubyte.gz
0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34 10008 fashion_mnist/t10k-labels-idx1-ubyte.gz
c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888 47040016 fashion_mnist/train-images-idx3-ubyte.gz
bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9 60008 fashion_mnist/train-labels-idx1-ubyte.gz
0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7 7840016 mnist/t10k-images-idx3-ubyte.gz
ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2 10008 mnist/t10k-labels-idx1-ubyte.gz
ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db 47040016 mnist/train-images-idx3-ubyte.gz
65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5 60008 mnist/train-labels-idx1-ubyte.gz
"""

# md5 of the CIFAR-10 python batches (cs.toronto.edu; torchvision): the only digests
# published for them. The archive itself is checked by sha256 (Keras' file_hash).
_CIFAR_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR_BATCH_DIR = "cifar10/cifar-10-batches-py"
CIFAR_ARCHIVE = "cifar10/cifar-10-python.tar.gz"
CIFAR_ARCHIVE_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TINY_SHAKESPEARE = "tinyshakespeare/input.txt"


def _parse_table(text: str, kind: str) -> dict[str, FileSpec]:
    out = {}
    for line in text.strip().splitlines():
        digest, size, path = line.split()
        out[path] = FileSpec(digest, int(size), kind)
    return out


REGISTRY: dict[str, FileSpec] = {
    **_parse_table(_SHA256_TABLE, "sha256"),
    **_parse_table(_IDX_TABLE, "gunzip-sha256"),
    **{
        f"{CIFAR_BATCH_DIR}/{k}": FileSpec(v, None, "md5")
        for k, v in _CIFAR_MD5.items()
    },
    CIFAR_ARCHIVE: FileSpec(
        "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        170_498_071,
        "sha256",
    ),  # md5 c58f30108f718f92721af3b95e74349a
}
"""Expected content of every known file, keyed by path relative to the data dir."""

_IDX_NAMES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
DOWNLOAD_URLS: dict[str, str] = {
    **{
        f"mnist/{n}": f"https://storage.googleapis.com/cvdf-datasets/mnist/{n}"
        for n in _IDX_NAMES
    },
    **{
        f"fashion_mnist/{n}": f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{n}"
        for n in _IDX_NAMES
    },
    CIFAR_ARCHIVE: CIFAR_ARCHIVE_URL,
    TINY_SHAKESPEARE: "https://raw.githubusercontent.com/karpathy/char-rnn/master/"
    "data/tinyshakespeare/input.txt",  # the URL (and sha256) TFDS uses
}
"""Public URLs for ``download=True`` (path relative to the cache dir -> URL)."""


def _femnist_files() -> tuple[str, ...]:
    return tuple(sorted(p for p in REGISTRY if p.startswith("femnist_leaf/")))


DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo(
            "mnist",
            "mnist",
            {"idx": tuple(f"mnist/{n}" for n in _IDX_NAMES)},
            "60,000 train / 10,000 test, 28x28 uint8, 10 classes",
            "load_mnist(download=True), TFDS 'mnist', or the four IDX .gz files "
            "from storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        DatasetInfo(
            "fashion_mnist",
            "fashion_mnist",
            {"idx": tuple(f"fashion_mnist/{n}" for n in _IDX_NAMES)},
            "60,000 train / 10,000 test, 28x28 uint8, 10 classes",
            "load_fashion_mnist(download=True), TFDS 'fashion_mnist', or "
            "github.com/zalandoresearch/fashion-mnist (data/fashion/)",
        ),
        DatasetInfo(
            "cifar10",
            "cifar10",
            {
                "pickle": tuple(f"{CIFAR_BATCH_DIR}/{k}" for k in _CIFAR_MD5),
                "npy": tuple(
                    f"cifar10/{s}_{a}"
                    for s in ("train", "test")
                    for a in ("x.npy.xz", "y.npy")
                ),
            },
            "pickle: 50,000 / 10,000 (original order); npy: 49,873 / 9,966 "
            "class-sorted (161 images missing)",
            "load_cifar10(download=True), TFDS 'cifar10', or cifar-10-python.tar.gz "
            "from www.cs.toronto.edu/~kriz/cifar.html extracted into cifar10/",
        ),
        DatasetInfo(
            "femnist",
            "femnist_leaf",
            {"leaf": _femnist_files()},
            "300 writers, 41,202 train / 4,730 test, 28x28 float, 62 classes",
            "LEAF (github.com/TalwalkarLab/leaf) data/femnist: ./preprocess.sh -s niid "
            "--sf 0.05 -k 0 -t sample; this subset's provenance: the data README",
        ),
        DatasetInfo(
            "vehicle",
            "vehicle_ditto",
            {"ditto": ("vehicle_ditto/train/mytrain.json.gz",)},
            "23 clients, 1,860 rows, 100 features, y in {-1,+1} (train only)",
            "Ditto (github.com/litian96/ditto) data/vehicle; raw vehicle.mat from "
            "MOCHA (github.com/gingsmith/fmtl)",
        ),
        DatasetInfo(
            "celeba",
            "celeba_leaf_ditto",
            {
                "leaf": tuple(
                    p
                    for p in REGISTRY
                    if p.startswith("celeba_leaf_ditto/t") and p.endswith(".json.gz")
                )
            },
            "515 celebrities, 9,060 train / 2,399 test, smiling label; needs images",
            "partition: LEAF data/celeba (Ditto's split); images: img_align_celeba.zip "
            "from mmlab.ie.cuhk.edu.hk/projects/CelebA.html unzipped into "
            "celeba_leaf_ditto/img_align_celeba/, or TFDS 'celeb_a'",
        ),
        DatasetInfo(
            "shakespeare",
            "tinyshakespeare",
            {"tiny": ("tinyshakespeare/input.txt",)},
            "one client per speaking role (tiny: 299 roles, 183 with a test "
            "window), next-char prediction, LEAF 80-char vocab, len 80",
            "load_shakespeare(download=True), TFDS 'tiny_shakespeare' "
            "(source='tfds'), or github.com/karpathy/char-rnn "
            "data/tinyshakespeare/input.txt; or LEAF data/shakespeare json in "
            "shakespeare_leaf/{train,test}/ (verify=False)",
        ),
    )
}
"""Known datasets: their folders, file layouts, sizes and where to get them."""


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir``, else ``$FEDJAX_PFL_DATA_DIR``.

    Raises:
      DatasetError: if neither is given.
    """
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV)
    if not data_dir:
        raise DatasetError(
            f"data_dir: no data directory given and ${DATA_DIR_ENV} is not set; "
            "see docs/datasets.md"
        )
    return Path(data_dir).expanduser()


def default_cache_dir() -> Path:
    """``$FEDJAX_PFL_CACHE_DIR``, else ``~/.cache/fedjax_pfl`` (downloads go here)."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedjax_pfl"


def _obtain_hint(relpath: str) -> str:
    for d in DATASETS.values():
        if relpath.startswith(d.subdir + "/"):
            return f"Obtain {d.name}: {d.obtain}."
    return "See docs/datasets.md."


def _gunzip(data: bytes, path: Path | str) -> bytes:
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as e:
        raise DatasetError(f"{path}: truncated or corrupt gzip file ({e})") from e


def _check(data: bytes, content: bytes | None, spec: FileSpec) -> str | None:
    """Returns a problem description, or None when ``data`` matches ``spec``."""
    target = content if spec.kind == "gunzip-sha256" else data
    if spec.size is not None and len(target) != spec.size:
        return f"size {len(target)} bytes, expected {spec.size} (truncated?)"
    algo = "md5" if spec.kind == "md5" else "sha256"
    got = hashlib.new(algo, target).hexdigest()
    if got != spec.digest:
        return f"{algo} {got} does not match the expected {spec.digest}"
    return None


def _raise_if_bad(path: Path, problem: str | None, hint: str) -> None:
    if problem:
        raise DatasetError(
            f"{path}: {problem}; the file is corrupt or not the expected version. {hint}"
        )


def read_verified(
    root: str | os.PathLike,
    relpath: str,
    *,
    decompress: bool = False,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> bytes:
    """Reads ``root/relpath`` whole, checks it against the registry, returns its bytes.

    Args:
      root: the data (or cache) directory.
      relpath: path relative to ``root``, the registry key.
      decompress: gunzip the file and return its content.
      verify: check size and hash; ``False`` only reads (for files you made).
      registry: overrides :data:`REGISTRY` (e.g. for tiny test files).

    Raises:
      DatasetError: the file is missing, unreadable, truncated, corrupt, has no
        registry entry (with ``verify=True``) or fails its check.
    """
    registry = REGISTRY if registry is None else registry
    path = Path(root) / relpath
    if not path.is_file():
        raise DatasetError(f"{path}: file not found. {_obtain_hint(relpath)}")
    spec = registry.get(relpath)
    if verify and spec is None:
        raise DatasetError(
            f"{path}: no known hash for this file; pass verify=False to load files "
            "you produced yourself"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from e
    hint = _obtain_hint(relpath)
    gz_spec = verify and spec.kind == "gunzip-sha256"
    if verify and not gz_spec:  # hash the file before parsing any of it
        _raise_if_bad(path, _check(data, None, spec), hint)
    content = None
    if decompress or gz_spec:
        try:
            content = _gunzip(data, path)
        except DatasetError as e:
            raise DatasetError(f"{e}. {hint}") from e
    if gz_spec:
        _raise_if_bad(path, _check(data, content, spec), hint)
    return content if decompress else data


def download_file(url: str, dest: str | os.PathLike, spec: FileSpec | None) -> Path:
    """Fetches ``url`` to ``dest`` atomically, verified against ``spec`` before use.

    Raises:
      DatasetError: on a network error or a hash mismatch (nothing is kept).
    """
    dest = Path(dest)
    if spec is None:
        raise DatasetError(
            f"{dest.name}: refusing to download a file with no known hash"
        )
    if not url.startswith(("https://", "http://", "file://")):
        raise DatasetError(f"{url}: unsupported URL scheme")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as r:
            while chunk := r.read(1 << 20):
                out.write(chunk)
        data = Path(tmp).read_bytes()
        content = _gunzip(data, url) if spec.kind == "gunzip-sha256" else None
        problem = _check(data, content, spec)
        if problem:
            raise DatasetError(f"{url}: downloaded file rejected: {problem}")
        os.replace(tmp, dest)
    except OSError as e:
        raise DatasetError(f"{url}: download failed ({e})") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def locate(
    files: Sequence[str],
    data_dir: str | os.PathLike | None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    registry: Mapping[str, FileSpec] | None = None,
) -> Path:
    """The directory holding all ``files``: the data dir, else the download cache.

    With ``download=True`` missing files are fetched from :data:`DOWNLOAD_URLS`
    into ``cache_dir`` (default :func:`default_cache_dir`).

    Raises:
      DatasetError: naming the missing files and where to obtain them.
    """
    registry = REGISTRY if registry is None else registry
    env = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    roots = [Path(env).expanduser()] if env else []
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    roots.append(cache)
    for root in roots:
        if all((root / f).is_file() for f in files):
            return root
    if not download:
        where = " or ".join(str(r) for r in roots)
        if not env:
            where += f" (no data_dir given and ${DATA_DIR_ENV} is not set)"
        raise DatasetError(
            f"missing {', '.join(files)} under {where}. {_obtain_hint(files[0])}"
        )
    for f in files:
        if not (cache / f).is_file():
            if f not in DOWNLOAD_URLS:
                raise DatasetError(f"{f}: no download URL known")
            download_file(DOWNLOAD_URLS[f], cache / f, registry.get(f))
    return cache


def dataset_status(
    data_dir: str | os.PathLike | None = None,
    *,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """One row per known dataset: files found and verified, size, how to obtain it.

    Each dataset is looked up in the data dir, then in the download cache (where
    ``download=True`` puts files and where the loaders look next); the better of
    the two is reported (``dir`` says which).

    Args:
      data_dir: defaults to ``$FEDJAX_PFL_DATA_DIR``; with neither, only the
        cache is searched (and each missing row says so).
      verify: hash every file (reads all of them, ~200 MB); ``False`` checks
        presence and size only.
      cache_dir: defaults to :func:`default_cache_dir`.

    Returns:
      dicts with ``name, dir, layout, status ("ok", "missing", "partial",
      "corrupt"), found, verified, expected, bytes, summary, problems, obtain``.
    """
    registry = REGISTRY if registry is None else registry
    env = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    roots = [Path(env).expanduser()] if env else []
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if cache.is_dir() or not roots:
        roots.append(cache)
    rows = []
    for d in DATASETS.values():
        best = None
        for root in roots:
            row = _dataset_row(root, d, verify, registry)
            if best is None or _rank(row) > _rank(best):
                best = row
        if not env:
            best["problems"].append(
                f"no data_dir given and ${DATA_DIR_ENV} is not set: searched "
                "the download cache only"
            )
        rows.append(best)
    return rows


def _rank(row: Mapping[str, Any]) -> tuple[int, int]:
    return row["verified"], row["found"]


def _dataset_row(root: Path, d: DatasetInfo, verify, registry) -> dict[str, Any]:
    best = None
    for layout, files in d.layouts.items():
        row = _layout_status(root, d, layout, files, verify, registry)
        if best is None or _rank(row) > _rank(best):
            best = row
    images = root / d.subdir / "img_align_celeba"
    if d.name == "celeba" and best["status"] == "ok" and not images.is_dir():
        best["status"] = "partial"
        best["problems"].append("images: img_align_celeba/ not found")
    return best


def _layout_status(root, d, layout, files, verify, registry) -> dict[str, Any]:
    found = verified = nbytes = 0
    problems = []
    for f in files:
        path = root / f
        if not path.is_file():
            continue
        found += 1
        nbytes += path.stat().st_size
        spec = registry.get(f)
        try:
            if verify:
                read_verified(root, f, registry=registry)
            elif (
                spec is not None
                and spec.kind != "gunzip-sha256"
                and (spec.size is not None and path.stat().st_size != spec.size)
            ):
                raise DatasetError(f"{path}: size differs from the registry")
            verified += 1
        except DatasetError as e:
            problems.append(str(e).split(". Obtain")[0])
    n = len(files)
    if found == 0:
        status = "missing"
    elif problems:
        status = "corrupt"
    elif found < n:
        status = "partial"
    else:
        status = "ok"
    if found < n:
        problems.append(f"{n - found} of {n} files missing")
    return {
        "name": d.name,
        "dir": str(root / d.subdir),
        "layout": layout,
        "status": status,
        "found": found,
        "verified": verified,
        "expected": n,
        "bytes": nbytes,
        "summary": d.summary,
        "problems": problems,
        "obtain": d.obtain,
    }


def format_dataset_status(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`dataset_status` rows, problems listed below."""
    head = ("dataset", "status", "layout", "files", "MB", "contents")
    body = [
        (
            r["name"],
            r["status"],
            r["layout"],
            f"{r['verified']}/{r['expected']}",
            f"{r['bytes'] / 1e6:.1f}",
            r["summary"],
        )
        for r in rows
    ]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(5)]
    lines = []
    for x in [head, *body]:
        cells = [str(c).ljust(w) for c, w in zip(x[:5], widths)]
        lines.append("  ".join([*cells, str(x[5])]))
    lines.insert(1, "-" * len(lines[0]))
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"\n{r['name']}: " + "; ".join(r["problems"]))
            lines.append(f"  obtain: {r['obtain']}")
    return "\n".join(lines)


def memory_summary(data: Any) -> dict[str, Any]:
    """Bytes held by a :class:`FederatedData` vs its raw examples and a padding.

    Returns:
      ``num_clients``; per-split ``examples``; ``raw_nbytes``, the bytes of the
      examples themselves (every split's ``x`` and ``y``, no per-client
      structure); ``nbytes``, what the container holds (flat storage plus
      offsets, counts and key ids); ``overhead_factor = nbytes / raw_nbytes``
      (~1: nothing is padded); ``padded_nbytes``, what a ``[clients, max_count]``
      padded layout would need; ``padding_factor = padded_nbytes / raw_nbytes``.
    """
    raw = sum(int(s.x.nbytes) + int(s.y.nbytes) for s in data.splits().values())
    nbytes = data.nbytes() + int(data.key_ids.nbytes)
    padded = data.padded_nbytes()
    return {
        "num_clients": data.num_clients,
        "examples": {k: s.num_examples for k, s in data.splits().items()},
        "raw_nbytes": raw,
        "nbytes": nbytes,
        "overhead_factor": nbytes / max(raw, 1),
        "padded_nbytes": padded,
        "padding_factor": padded / max(raw, 1),
    }
