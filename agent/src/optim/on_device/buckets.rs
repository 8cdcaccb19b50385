//! A data-parallel rank's gradient sums on their way through the all-reduce
//! while its step stays on the device: whole parameters grouped into
//! buckets, each bucket concatenated on the device and read back in one
//! submission ([`BucketDown::read`], the only waits for the device), summed
//! over the ranks on the host, and written back in one upload that is cut
//! into the parameters' sums again ([`DeviceOptimizer::put_bucket`]).
//!
//! Reading a bucket back is separate from taking it so that the trainer can
//! read bucket `k + 1` on a thread of its own while bucket `k` is on the ring
//! (`training::gradients`). The last bucket also carries the rank's loss sum
//! ([`DeviceOptimizer::set_loss`]), so that the step's loss over every rank
//! comes back with its gradients, with no read of its own.

use std::ops::Range;

use burn::tensor::{Tensor, TensorData};

use super::{DeviceOptimizer, Held, Shaped};

/// One bucket's gradient sums, concatenated on the device and not yet read.
#[derive(Debug)]
pub struct BucketDown {
    /// The parameters it holds (flat order).
    pub params: Range<usize>,
    /// Per parameter, its shape where this rank knows it.
    dims: Vec<Option<Vec<usize>>>,
    /// Whether the loss sum follows the parameters' values.
    loss: bool,
    flat: Tensor<1>,
}

/// One bucket's gradient sums on the host, in the parameters' flat order.
#[derive(Debug)]
pub struct BucketHost {
    /// The parameters it holds (flat order).
    pub params: Range<usize>,
    dims: Vec<Option<Vec<usize>>>,
    loss: bool,
    /// Their values, one parameter after the other (then the loss sum, in
    /// the last bucket).
    pub values: Vec<f32>,
}

impl BucketDown {
    /// Reads the bucket back: one wait for the device.
    ///
    /// # Panics
    /// Never for a bucket of `f32` sums (the values are converted first).
    pub fn read(self) -> BucketHost {
        let data = self.flat.into_data().convert::<f32>();
        let values = data.try_into_vec::<f32>().expect("values converted to f32");
        BucketHost {
            params: self.params,
            dims: self.dims,
            loss: self.loss,
            values,
        }
    }
}

impl BucketHost {
    /// A copy of the values, for a step that may not be taken (they go back
    /// with [`DeviceOptimizer::put_bucket`] as they were).
    pub fn copy(&self) -> BucketHost {
        BucketHost {
            params: self.params.clone(),
            dims: self.dims.clone(),
            loss: self.loss,
            values: self.values.clone(),
        }
    }
}

impl DeviceOptimizer {
    /// The parameters in consecutive buckets of at most `values` values
    /// each (a larger parameter alone in its own), the same on every rank.
    pub fn buckets(&self, values: usize) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let (mut start, mut held) = (0, 0);
        for (i, &n) in self.sizes.iter().enumerate() {
            if i > start && held + n > values {
                out.push(start..i);
                (start, held) = (i, 0);
            }
            held += n;
        }
        if start < self.sizes.len() {
            out.push(start..self.sizes.len());
        }
        out
    }

    /// Values the parameters `params` hold.
    pub fn bucket_len(&self, params: &Range<usize>) -> usize {
        self.sizes[params.clone()].iter().sum()
    }

    /// Sets this rank's share of the step's loss (its micro-batches' loss
    /// sums, on the device; none for a rank without rows): it travels in the
    /// last bucket and comes back summed over the ranks
    /// ([`take_summed_loss`](Self::take_summed_loss)).
    pub fn set_loss(&mut self, losses: Vec<Tensor<1>>) {
        self.loss = match losses.len() {
            0 => None,
            1 => losses.into_iter().next(),
            _ => Some(Tensor::cat(losses, 0).sum()),
        };
    }

    /// The step's loss summed over the ranks, once its last bucket is back.
    pub fn take_summed_loss(&mut self) -> Option<f32> {
        self.summed_loss.take()
    }

    /// Takes the sums of `params` out, concatenated on the device (a
    /// parameter without a gradient as zeros): queued, not read.
    pub fn take_bucket(&mut self, params: Range<usize>) -> BucketDown {
        let mut dims = Vec::with_capacity(params.len());
        let mut parts = Vec::with_capacity(params.len());
        for i in params.clone() {
            let n = self.sizes[i];
            let (shape, part) = match self.sums[i].take() {
                Some(Held::Device(t)) => (Some(t.dims()), t.flat()),
                Some(Held::Host(values)) => (
                    None,
                    Tensor::from_data(TensorData::new(values, [n]), &self.device),
                ),
                None => (None, Tensor::zeros([n], &self.device)),
            };
            dims.push(shape.or_else(|| self.master_dims(i)));
            parts.push(part);
        }
        let loss = params.end == self.sizes.len();
        if loss {
            parts.push(
                self.loss
                    .take()
                    .unwrap_or_else(|| Tensor::zeros([1], &self.device)),
            );
        }
        let flat = match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => Tensor::cat(parts, 0),
        };
        BucketDown {
            params,
            dims,
            loss,
            flat,
        }
    }

    /// Puts a bucket's (all-reduced) sums back as the gathered sums of its
    /// parameters: one upload, cut into each parameter's shape (a parameter
    /// whose shape is not known yet keeps the host's values until its step).
    pub fn put_bucket(&mut self, mut bucket: BucketHost) {
        if bucket.loss {
            self.summed_loss = bucket.values.pop();
        }
        let n = bucket.values.len();
        let flat = Tensor::<1>::from_data(TensorData::new(bucket.values, [n]), &self.device);
        let mut at = 0;
        for (i, dims) in bucket.params.zip(bucket.dims) {
            let len = self.sizes[i];
            let part = flat.clone().narrow(0, at, len);
            at += len;
            self.sums[i] = Some(match dims {
                Some(dims) => Held::Device(shaped(part, &dims)),
                None => Held::Host(
                    part.into_data()
                        .convert::<f32>()
                        .try_into_vec::<f32>()
                        .expect("f32 values"),
                ),
            });
        }
    }

    /// Parameter `index`'s shape where its master weights are on the device.
    fn master_dims(&self, index: usize) -> Option<Vec<usize>> {
        match &self.master[index] {
            Held::Device(t) => Some(t.dims()),
            Held::Host(_) => None,
        }
    }
}

/// `flat` in the shape `dims` (burn's parameters have at most 6 dimensions).
///
/// # Panics
/// On a parameter of more than 6 dimensions (none of burn's modules has one).
fn shaped(flat: Tensor<1>, dims: &[usize]) -> Box<dyn Shaped> {
    match *dims {
        [a] => Box::new(flat.reshape([a])),
        [a, b] => Box::new(flat.reshape([a, b])),
        [a, b, c] => Box::new(flat.reshape([a, b, c])),
        [a, b, c, d] => Box::new(flat.reshape([a, b, c, d])),
        [a, b, c, d, e] => Box::new(flat.reshape([a, b, c, d, e])),
        [a, b, c, d, e, f] => Box::new(flat.reshape([a, b, c, d, e, f])),
        _ => panic!("a parameter of {} dimensions", dims.len()),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};
    use kindling_schemas::spec::{JobSpec, OptimizerSpec};

    use super::DeviceOptimizer;
    use crate::optim::FlatOptimizer;

    fn optimizer(sizes: &[usize]) -> (DeviceOptimizer, Device) {
        let layout: Vec<(String, usize)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("p{i}"), n))
            .collect();
        let spec = JobSpec::builder()
            .features(["a"])
            .label("y")
            .optimizer(OptimizerSpec::adam(0.1))
            .build()
            .expect("spec");
        let flat = FlatOptimizer::for_job(&spec, &layout).expect("optimizer");
        let weights = vec![0.5; sizes.iter().sum()];
        let device = Device::default();
        (
            DeviceOptimizer::upload(&flat, &weights, &layout, None, &device),
            device,
        )
    }

    #[test]
    fn buckets_hold_whole_parameters_in_order() {
        let (opt, _) = optimizer(&[6, 3, 5, 20, 1]);
        assert_eq!(opt.buckets(10), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(opt.buckets(100), vec![0..5]);
        assert_eq!(opt.buckets(1), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        assert_eq!(opt.bucket_len(&(0..2)), 9);
    }

    /// Down, summed as a ring of two would, and back: each parameter's sums
    /// doubled in its own shape, a parameter with no gradient coming back
    /// as the other rank's (here its own zeros, doubled: zeros), the loss
    /// doubled beside them, and the step on the result the one a doubled
    /// gradient gives.
    #[test]
    fn a_bucket_goes_down_and_comes_back_in_each_parameters_shape() {
        let (mut opt, device) = optimizer(&[6, 3, 5]);
        let (mut twice, _) = optimizer(&[6, 3, 5]);
        let m: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
        let v: Vec<f32> = vec![1.0, -2.0, 0.5];
        opt.add_gradient(
            0,
            Tensor::<2>::from_data(TensorData::new(m.clone(), [2, 3]), &device),
        );
        opt.add_gradient(
            1,
            Tensor::<1>::from_data(TensorData::new(v.clone(), [3]), &device),
        );
        let doubled = |x: &[f32]| x.iter().map(|g| g * 2.0).collect::<Vec<f32>>();
        twice.add_gradient(
            0,
            Tensor::<2>::from_data(TensorData::new(doubled(&m), [2, 3]), &device),
        );
        twice.add_gradient(
            1,
            Tensor::<1>::from_data(TensorData::new(doubled(&v), [3]), &device),
        );
        // The step's loss (two micro-batches' sums) rides in the last bucket.
        let loss = |v: f32| Tensor::<1>::from_data(TensorData::new(vec![v], [1]), &device);
        opt.set_loss(vec![loss(1.25), loss(0.25)]);
        for params in opt.buckets(9) {
            let mut host = opt.take_bucket(params).read();
            host.values.iter_mut().for_each(|g| *g *= 2.0);
            opt.put_bucket(host);
        }
        assert_eq!(opt.take_summed_loss(), Some(3.0));
        let stepped = |o: &mut DeviceOptimizer| {
            let scale = o.begin_step(0.5);
            let a: Tensor<2> = o.step_param(0, &scale, [2, 3]);
            let b: Tensor<1> = o.step_param(1, &scale, [3]);
            let c: Tensor<1> = o.step_param(2, &scale, [5]);
            (a.dims(), [a.into_data(), b.into_data(), c.into_data()])
        };
        let (dims, got) = stepped(&mut opt);
        let (_, want) = stepped(&mut twice);
        assert_eq!(dims, [2, 3]);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
        }
    }
}
