"""Tests of recurrl.envs.specs."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    Unbounded,
)


class TestUnbounded:
    def test_zero_rand_shapes(self):
        spec = Unbounded((2, 3))
        assert spec.zero().shape == (2, 3)
        assert spec.rand((4,)).shape == (4, 2, 3)
        assert spec.rand().dtype == torch.float32
        assert torch.equal(spec.zero(), torch.zeros(2, 3))

    def test_int_and_bool_dtypes(self):
        ints = Unbounded(5, dtype=torch.int64).rand((100,))
        assert ints.dtype == torch.int64 and ints.abs().max() <= 100
        assert Unbounded(5, dtype=torch.uint8).rand((100,)).min() >= 0
        assert Unbounded(5, dtype=torch.bool).rand().dtype == torch.bool

    def test_is_in(self):
        spec = Unbounded(3)
        assert spec.is_in(torch.randn(3))
        assert spec.is_in(torch.randn(7, 3))  # leading dims allowed
        assert not spec.is_in(torch.randn(4))
        assert not spec.is_in(torch.zeros(3, dtype=torch.float64))
        assert not spec.is_in([0.0, 0.0, 0.0])

    def test_int_shape(self):
        assert Unbounded(3).shape == torch.Size([3])


class TestBounded:
    def test_rand_within_bounds(self):
        spec = Bounded(-2.0, 3.0, shape=(4,))
        x = spec.rand((1000,))
        assert x.shape == (1000, 4) and x.min() >= -2 and x.max() <= 3
        assert spec.is_in(x)

    def test_shape_from_tensor_bounds(self):
        spec = Bounded(torch.zeros(2), torch.tensor([1.0, 5.0]))
        assert spec.shape == (2,)
        x = spec.rand((500,))
        assert (x[:, 1] > 1).any() and (x[:, 0] <= 1).all()

    def test_infinite_and_huge_bounds(self):
        big = torch.finfo(torch.float32).max
        low = torch.tensor([-1.0, -big, 0.0, -float("inf")])
        high = torch.tensor([1.0, big, float("inf"), float("inf")])
        spec = Bounded(low, high)
        x = spec.rand((1000,))
        assert torch.isfinite(x).all()
        assert spec.is_in(x)
        assert (x[:, 2] >= 0).all()

    def test_integer_bounds_inclusive(self):
        spec = Bounded(0, 2, shape=(), dtype=torch.int64)
        values = set(spec.rand((500,)).tolist())
        assert values == {0, 1, 2}

    def test_zero_is_clamped(self):
        spec = Bounded(1.0, 2.0, shape=(2,))
        assert torch.equal(spec.zero(), torch.ones(2))
        assert spec.is_in(spec.zero())

    def test_is_in_out_of_bounds(self):
        spec = Bounded(-1.0, 1.0, shape=(2,))
        assert not spec.is_in(torch.tensor([0.0, 1.5]))
        assert not spec.is_in(torch.tensor([float("nan"), 0.0]))

    def test_errors(self):
        with pytest.raises(ValueError, match="low <= high"):
            Bounded(1.0, 0.0)
        with pytest.raises(ValueError, match="cannot be broadcast"):
            Bounded(torch.zeros(3), torch.ones(3), shape=(2,))

    def test_expand_keeps_bounds(self):
        spec = Bounded(torch.tensor([0.0, -1.0]), torch.tensor([1.0, 0.0])).expand(3, 2)
        assert spec.shape == (3, 2) and spec.low.shape == (3, 2)
        assert torch.equal(spec.low[2], torch.tensor([0.0, -1.0]))


class TestCategorical:
    def test_rand_range(self):
        spec = Categorical(3, shape=(2,))
        x = spec.rand((200,))
        assert x.shape == (200, 2) and x.dtype == torch.int64
        assert set(x.unique().tolist()) == {0, 1, 2}

    def test_bool(self):
        spec = Categorical(2, shape=(1,), dtype=torch.bool)
        assert spec.rand().dtype == torch.bool
        assert spec.is_in(torch.tensor([True]))
        with pytest.raises(ValueError, match="requires n=2"):
            Categorical(3, dtype=torch.bool)

    def test_errors_and_is_in(self):
        with pytest.raises(ValueError, match="n >= 1"):
            Categorical(0)
        with pytest.raises(ValueError, match="integer or bool"):
            Categorical(2, dtype=torch.float32)
        spec = Categorical(3)
        assert spec.is_in(torch.tensor(2))
        assert not spec.is_in(torch.tensor(3))
        assert not spec.is_in(torch.tensor(-1))


class TestOneHot:
    def test_zero_rand_is_in(self):
        spec = OneHot(4, shape=(2, 4))
        assert torch.equal(spec.zero()[:, 0], torch.tensor([True, True]))
        x = spec.rand((10,))
        assert x.shape == (10, 2, 4) and (x.sum(-1) == 1).all()
        assert spec.is_in(x)
        assert not spec.is_in(torch.zeros(2, 4, dtype=torch.bool))

    def test_shape_error(self):
        with pytest.raises(ValueError, match="last dim is n=3"):
            OneHot(3, shape=(2,))


class TestMultiCategorical:
    def test_rand_per_entry(self):
        spec = MultiCategorical([2, 5])
        x = spec.rand((500,))
        assert x.shape == (500, 2)
        assert x[:, 0].max() == 1 and x[:, 1].max() == 4
        assert spec.is_in(x)
        assert not spec.is_in(torch.tensor([2, 0]))

    def test_errors(self):
        with pytest.raises(ValueError, match="positive counts"):
            MultiCategorical([2, 0])
        with pytest.raises(ValueError, match="ending with nvec"):
            MultiCategorical([2, 3], shape=(3,))

    def test_expand(self):
        spec = MultiCategorical([2, 3]).expand(4, 2)
        assert spec.rand().shape == (4, 2)


class TestBinary:
    def test_n_and_shape(self):
        assert Binary(3).shape == (3,)
        assert Binary(shape=(2, 3)).n == 3
        x = Binary(4).rand((50,))
        assert x.dtype == torch.int8 and set(x.unique().tolist()) <= {0, 1}
        assert not Binary(2).is_in(torch.tensor([0, 2], dtype=torch.int8))

    def test_errors(self):
        with pytest.raises(ValueError, match="expected n or shape"):
            Binary()
        with pytest.raises(ValueError, match="ending with n=3"):
            Binary(3, shape=(2,))


class TestLeafCommon:
    def test_expand_prepends_batch_dims(self):
        spec = Unbounded((1, 4))
        assert spec.expand(3, 1, 4).shape == (3, 1, 4)
        assert spec.expand((3, 1, 4)).shape == (3, 1, 4)
        assert spec.expand(torch.Size([2, 3, 1, 4])).shape == (2, 3, 1, 4)
        assert spec.shape == (1, 4)  # unchanged

    def test_expand_error_says_expected(self):
        with pytest.raises(ValueError, match=r"expected a shape ending with \(1, 4\)"):
            Unbounded((1, 4)).expand(3)

    def test_eq_clone_to(self):
        spec = Bounded(0.0, 1.0, shape=(2,))
        clone = spec.clone()
        assert clone == spec and clone is not spec
        assert spec != Bounded(0.0, 2.0, shape=(2,))
        assert spec != Unbounded((2,))
        assert Categorical(2) != Categorical(3)
        assert spec.to("cpu") == spec
        assert spec.to("cpu").device == torch.device("cpu")

    def test_repr(self):
        assert "n=3" in repr(Categorical(3))


class TestComposite:
    def make(self):
        spec = Composite(obs=Unbounded((2, 3)), shape=(2,))
        spec["nested", "flag"] = Categorical(2, shape=(2, 1), dtype=torch.bool)
        return spec

    def test_nested_keys(self):
        spec = self.make()
        assert spec.keys() == ["obs", "nested"]
        assert spec.keys(include_nested=True) == ["obs", "nested", ("nested", "flag")]
        assert spec.keys(include_nested=True, leaves_only=True) == ["obs", ("nested", "flag")]
        assert spec.keys(leaves_only=True) == ["obs"]
        assert isinstance(spec["nested"], Composite)
        assert spec["nested"].shape == (2,)
        assert ("nested", "flag") in spec and "flag" not in spec
        assert len(spec) == 2 and list(spec) == ["obs", "nested"]
        assert dict(spec.items())["obs"] == Unbounded((2, 3))
        assert spec.get("missing") is None

    def test_delete(self):
        spec = self.make()
        del spec["nested", "flag"]
        assert ("nested", "flag") not in spec
        assert spec.is_empty() is False
        del spec["obs"]
        assert spec.is_empty()
        with pytest.raises(KeyError, match="no key 'obs'"):
            del spec["obs"]

    def test_zero_rand_is_in(self):
        spec = self.make()
        td = spec.zero()
        assert isinstance(td, TensorDict) and td.batch_size == (2,)
        assert td["nested", "flag"].dtype == torch.bool
        assert spec.is_in(td)
        assert spec.rand((5,)).batch_size == (5, 2)
        assert not spec.is_in(td.exclude("obs"))
        td["obs"] = td["obs"].double()
        assert not spec.is_in(td)
        assert not spec.is_in(torch.zeros(2))

    def test_expand(self):
        spec = self.make().expand(4, 2)
        assert spec.shape == (4, 2)
        assert spec["obs"].shape == (4, 2, 3)
        assert spec["nested", "flag"].shape == (4, 2, 1)
        with pytest.raises(ValueError, match="ending with"):
            self.make().expand(4)

    def test_errors_name_key(self):
        spec = self.make()
        with pytest.raises(KeyError, match="'missing'"):
            spec["missing"]
        with pytest.raises(ValueError, match=r"key 'bad'.*starting with \(2,\)"):
            spec["bad"] = Unbounded(3)
        with pytest.raises(TypeError, match="expected a TensorSpec for key 'x'"):
            spec["x"] = torch.zeros(2)
        with pytest.raises(KeyError, match="is a leaf"):
            spec["obs", "sub"] = Unbounded((2,))

    def test_dict_entries_become_composites(self):
        spec = Composite({"a": {"b": Unbounded(())}})
        assert isinstance(spec["a"], Composite) and spec["a", "b"].shape == ()

    def test_update_merges_nested(self):
        spec = self.make()
        other = Composite(shape=(2,))
        other["nested", "h"] = Unbounded((2, 4))
        spec.update(other)
        assert ("nested", "flag") in spec and ("nested", "h") in spec
        spec.update({"obs": Unbounded((2, 5))})
        assert spec["obs"].shape == (2, 5)

    def test_clone_and_eq(self):
        spec = self.make()
        clone = spec.clone()
        assert clone == spec
        clone["extra"] = Unbounded((2,))
        assert clone != spec and "extra" not in spec
        assert spec != Composite(shape=(2,))

    def test_device_moves_entries(self):
        spec = Composite(x=Unbounded(2), device="cpu")
        assert spec["x"].device == torch.device("cpu")
        assert spec.to("cpu").device == torch.device("cpu")

    def test_repr(self):
        text = repr(self.make())
        assert "'obs'" in text and "'nested'" in text


class TestTo:
    """``spec.to`` takes a device and/or a dtype, as the reference's specs."""

    def test_dtype_positional_and_keyword(self):
        spec = Unbounded((2, 3)).to(torch.float64)
        assert spec.dtype == torch.float64 and spec.rand().dtype == torch.float64
        assert spec.zero().dtype == torch.float64 and spec.is_in(torch.zeros(2, 3).double())
        assert Unbounded(3).to(dtype=torch.int32).rand().dtype == torch.int32

    def test_device_and_dtype_together(self):
        for spec in (Unbounded(3).to("cpu", torch.float16),
                     Unbounded(3).to(device="cpu", dtype=torch.float16)):  # fmt: skip
            assert (spec.device, spec.dtype) == (torch.device("cpu"), torch.float16)

    def test_copy_not_in_place(self):
        spec = Unbounded(3)
        assert spec.to(torch.float64) is not spec and spec.dtype == torch.float32
        assert spec.to(None) == spec

    def test_bounded_casts_its_bounds(self):
        spec = Bounded(0.0, 3.0, shape=(2,)).to(torch.int64)
        assert spec.low.dtype == spec.high.dtype == torch.int64
        assert set(spec.rand((500,)).flatten().tolist()) == {0, 1, 2, 3}
        with pytest.raises(ValueError, match="infinite bounds"):
            Bounded(0.0, float("inf"), shape=(1,)).to(torch.int64)

    def test_categorical_dtypes(self):
        assert Categorical(2).to(torch.bool).zero().dtype == torch.bool
        with pytest.raises(ValueError, match="integer or bool dtype"):
            Categorical(3).to(torch.float32)
        with pytest.raises(ValueError, match="requires n=2"):
            Categorical(3).to(torch.bool)

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match=r"a device .* and/or a torch.dtype"):
            Unbounded(3).to(3.5)
        with pytest.raises(TypeError, match="two dtypes"):
            Unbounded(3).to(torch.float64, dtype=torch.float16)
        with pytest.raises(TypeError, match="unexpected keyword"):
            Unbounded(3).to(non_blocking=True)

    def test_composite_takes_a_device_not_a_dtype(self):
        spec = Composite(obs=Unbounded(3), nested=Composite(flag=Categorical(2)))
        moved = spec.to("cpu")
        assert moved.device == torch.device("cpu") and moved["nested", "flag"].device.type == "cpu"
        with pytest.raises(ValueError, match="only a device"):
            spec.to(torch.float64)


class TestUnsqueezeSqueeze:
    def test_leaf_unsqueeze_like_torch(self):
        for dim in range(-3, 3):
            assert Unbounded((2, 3)).unsqueeze(dim).shape == torch.zeros(2, 3).unsqueeze(dim).shape
        with pytest.raises(IndexError, match="dim an int"):
            Unbounded((2, 3)).unsqueeze(3)

    def test_bounded_bounds_follow(self):
        spec = Bounded(torch.zeros(2, 3), torch.arange(1.0, 7.0).reshape(2, 3)).unsqueeze(1)
        assert spec.shape == spec.low.shape == spec.high.shape == (2, 1, 3)
        assert torch.equal(spec.high[:, 0], torch.arange(1.0, 7.0).reshape(2, 3))
        assert spec.is_in(spec.rand()) and spec.squeeze(1) == Bounded(
            torch.zeros(2, 3), torch.arange(1.0, 7.0).reshape(2, 3)
        )

    def test_value_dims_are_kept_whole(self):
        assert OneHot(3, shape=(2, 3)).unsqueeze(1).shape == (2, 1, 3)
        with pytest.raises(ValueError, match="hold the values themselves"):
            OneHot(3, shape=(2, 3)).unsqueeze(-1)
        with pytest.raises(ValueError, match="hold the values themselves"):
            Binary(4).unsqueeze(1)
        assert MultiCategorical([[2, 3]], shape=(1, 2)).squeeze().shape == (1, 2)
        assert MultiCategorical([2, 3], shape=(1, 2)).squeeze(0).shape == (2,)

    def test_squeeze_as_the_reference(self):
        assert Unbounded((1, 2, 1)).squeeze().shape == (2,)
        assert Unbounded((1,)).squeeze().shape == (1,)  # the reference keeps a 1-dim shape
        assert Unbounded((1, 2)).squeeze(1).shape == (1, 2)  # not a size-1 dim: unchanged
        assert Unbounded((1, 2)).squeeze(-2).shape == (2,)
        spec = Categorical(4, shape=(2,))
        assert spec.unsqueeze(0).squeeze(0) == spec

    def test_composite_batch_dims(self):
        spec = Composite(
            obs=Unbounded((2, 3)), nested=Composite(flag=Categorical(2, shape=(2, 1))),
            shape=(2,),
        )  # fmt: skip
        up = spec.unsqueeze(0)
        assert up.shape == (1, 2) and up["obs"].shape == (1, 2, 3)
        assert up["nested"].shape == (1, 2) and up["nested", "flag"].shape == (1, 2, 1)
        assert up.squeeze(0) == spec and up.squeeze() == spec
        assert spec.unsqueeze(-1)["obs"].shape == (2, 1, 3)
        with pytest.raises(IndexError):
            spec.unsqueeze(2)  # only batch dims


class TestNestedComposite:
    """A Composite as the value of a key (the reference's nested specs)."""

    def make(self, shape=()):
        inner = Composite(a=Unbounded((*shape, 3)), b=Categorical(4, shape=shape), shape=shape)
        return Composite(obs=inner, flag=Categorical(2, shape=(*shape, 1), dtype=torch.bool),
                         shape=shape)  # fmt: skip

    def test_index_and_keys(self):
        spec = self.make()
        assert spec["obs", "a"] == Unbounded(3) and spec[("obs", "b")].n == 4
        assert spec["obs"]["a"] is spec["obs", "a"]
        assert spec.keys(include_nested=True, leaves_only=True) == [
            ("obs", "a"), ("obs", "b"), "flag",
        ]  # fmt: skip
        assert ("obs", "a") in spec and ("obs", "c") not in spec

    def test_rand_zero_is_in(self):
        spec = self.make((2,))
        td = spec.rand((5,))
        assert td.batch_size == (5, 2) and td["obs"].batch_size == (5, 2)
        assert td["obs", "a"].shape == (5, 2, 3) and spec.is_in(td)
        zero = spec.zero()
        assert zero["obs", "b"].shape == (2,) and bool((zero["obs", "a"] == 0).all())
        assert spec.is_in(zero)
        zero["obs", "b"] = torch.full((2,), 7)
        assert not spec.is_in(zero)
        assert not spec.is_in(zero.exclude(("obs", "a")))

    def test_expand(self):
        spec = self.make().expand(4)
        assert spec.shape == spec["obs"].shape == (4,)
        assert spec["obs", "a"].shape == (4, 3) and spec["flag"].shape == (4, 1)
        deeper = self.make((2,)).expand(5, 2)
        assert deeper["obs", "a"].shape == (5, 2, 3) and deeper["obs"].shape == (5, 2)

    def test_nested_dict_value(self):
        spec = Composite(obs={"a": Unbounded(3)})
        assert isinstance(spec["obs"], Composite) and spec["obs", "a"].shape == (3,)

    def test_nested_composite_written_without_the_batch_shape(self):
        # its leaves hold the parent's batch dims: it takes the parent's batch shape
        spec = Composite(obs=Composite(a=Unbounded((2, 3))), shape=(2,))
        assert spec["obs"].shape == (2,) and spec.rand()["obs"].batch_size == (2,)
        with pytest.raises(ValueError, match="expected a shape starting with"):
            Composite(obs=Composite(a=Unbounded(3)), shape=(2,))  # leaves without them
