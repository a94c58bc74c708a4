"""pytorch/resnet and tf/resnet compute the same network: given torch's weights, the TF build
gives torch's logits. This holds only if the two pad alike: a strided conv and the stem's max
pool pad all four sides in both (tf/resnet's fixed_padding and explicit paddings), where a
strided "same" would pad an even input at the bottom and right only. And both report top-1
and, above five classes, top-5 accuracy, alike on the same logits."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

from common import zoo  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import load_params  # noqa: E402


def twin(framework):
    folder = os.path.join(zoo.ROOT, framework, "resnet")
    model, utils = import_beside(os.path.join(folder, "run.py"), "model", "utils")
    return model, utils


# both blocks and both stems; even maps (32 -> 16 -> 8 -> 4 -> 2), where "same" would pad one side only
@pytest.mark.parametrize("block, stem", [("bottleneck", "imagenet"), ("basic", "cifar")])
def test_tf_resnet_gives_torch_resnets_logits_from_its_weights(block, stem):
    overrides = [f"model.block={block}", f"model.stem={stem}", "model.stage_blocks=[1, 1]",
                 "model.stage_widths=[4, 8]", "model.stem_width=8", "model.image_size=32"]
    pt_model, pt_utils = twin("pytorch")
    tf_model, tf_utils = twin("tf")
    pt_params = load_params(None, pt_utils.default_params(), overrides)
    tf_params = load_params(None, tf_utils.default_params(), overrides)

    torch.manual_seed(0)
    net = pt_model.ResNet(pt_params["model"]).eval()  # eval: batch norm uses its running statistics
    rng = np.random.default_rng(0)
    convs, norms = [], []
    for module in net.modules():
        if isinstance(module, torch.nn.Conv2d):
            convs.append(module.weight.detach().numpy().transpose(2, 3, 1, 0))  # OIHW -> HWIO
        elif isinstance(module, torch.nn.BatchNorm2d):  # statistics that are not 0 and 1, so that a mix-up shows
            with torch.no_grad():
                for tensor in (module.weight, module.bias, module.running_mean):
                    tensor.copy_(torch.from_numpy(rng.normal(0, 0.5, tensor.shape).astype(np.float32)))
                module.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, module.running_var.shape)
                                                          .astype(np.float32)))
            norms.append([t.detach().numpy() for t in (module.weight, module.bias, module.running_mean,
                                                       module.running_var)])
    images = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)  # (B, C, H, W)
    with torch.no_grad():
        expected = net(torch.from_numpy(images)).numpy()

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 32, 32, 3])
        logits = tf_model.resnet(x, tf_params, training=False)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        assert len(convs) == len(norms) == len([n for n in variables if n.endswith("/kernel")]) - 1
        values = {"logits/kernel": net.fc.weight.detach().numpy().T, "logits/bias": net.fc.bias.detach().numpy()}
        # TF's layers are named in build order, conv_k then its bn_k: torch's module order
        for k, (kernel, (gamma, beta, mean, var)) in enumerate(zip(convs, norms), start=1):
            values.update({f"conv_{k}/kernel": kernel, f"bn_{k}/gamma": gamma, f"bn_{k}/beta": beta,
                           f"bn_{k}/moving_mean": mean, f"bn_{k}/moving_variance": var})
        assert sorted(values) == sorted(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            for name, value in values.items():
                variables[name].load(value, session)
            got = session.run(logits, {x: images.transpose(0, 2, 3, 1)})  # NCHW -> NHWC
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_both_give_top5_accuracy_above_five_classes_and_agree_on_it():
    pt_model, pt_utils = twin("pytorch")
    tf_model, _ = twin("tf")
    rng = np.random.default_rng(1)
    logits = rng.permutation(40).reshape(4, 10).astype(np.float32)  # (B, classes), no ties
    rank = np.argsort(-logits, axis=1)  # each row's classes, largest logit first
    labels = np.array([rank[0, 0], rank[1, 2], rank[2, 4], rank[3, 5]])  # 1st, 3rd, 5th and 6th largest
    metric = pt_model.TopKAccuracy(5)
    metric.update({"logits": torch.from_numpy(logits)}, (None, torch.from_numpy(labels)))
    assert metric.result() == 3 / 4
    graph = tf.Graph()
    with graph.as_default():
        metrics = tf_model.eval_metrics(tf.constant(labels, tf.int64), tf.constant(logits))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.local_variables_initializer())
            session.run([update for _, update in metrics.values()])
            got = session.run({name: value for name, (value, _) in metrics.items()})
    assert got == {"accuracy": 1 / 4, "top5_accuracy": 3 / 4}

    # five classes or fewer: top-5 is always 1, so neither framework reports it
    params = load_params(None, pt_utils.default_params(), ["model.num_classes=5"])
    assert set(pt_model.ResNetModel(params, torch.device("cpu")).metrics) == {"accuracy"}
    graph = tf.Graph()
    with graph.as_default():
        assert set(tf_model.eval_metrics(tf.constant(labels % 5), tf.constant(logits[:, :5]))) == {"accuracy"}
